// Chat messages -> prompt tokens. With the `chat_template` setting auto (the default) the GGUF's
// tokenizer.chat_template is rendered by tessera's Jinja interpreter (tessera/chat_template.h) as
// transformers renders it, with add_generation_prompt and the vocabulary's BOS/EOS texts, and the
// text is encoded with control tokens parsed. A template that does not parse, or fails on a plain
// user message, gives the default format below, with a warning in the log and in /v1/models.
// Built-in formats, forced by the setting (`jinja` forces the GGUF's template, refusing to start
// when it cannot be used):
//
//   chatml   <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n      (stop <|im_end|>)
//   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...      (stop <|eot_id|>)
//   llama2   [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...
//   zephyr   <|system|>\ncontent</s>\n<|user|>\ncontent</s>\n<|assistant|>\n
//
// A model without a template gets the documented default:
//
//   default  <|system|>\ncontent\n<|user|>\ncontent\n<|assistant|>\n                  (stop <|user|>)
//
// Markers that are single tokens in the vocabulary (control tokens such as <|im_end|>) are emitted as
// those tokens; text between them is encoded as text. detect() still recognises a template's format
// by its markers, for callers that want the name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "openai_request.h"
#include "tessera/chat_template.h"
#include "tessera/tokenizer.h"

namespace tessera::serve {

enum class ChatFormat { chatml, llama3, llama2, zephyr, fallback, jinja };

struct ChatSegment {
  bool special = false;  // a marker to emit as its token when the vocabulary has it
  std::string text;
};

class ChatTemplate {
 public:
  // `setting` is auto | jinja | chatml | llama2 | llama3 | zephyr | default; with auto, `gguf_template`
  // (may be empty) decides. `note` receives a line for the log saying what was chosen and why (a
  // "warning: " line when the model's template could not be used).
  static ChatTemplate choose(const std::string& setting, const std::string& gguf_template, std::string* note);
  // The format's markers recognised in a template text; fallback when none matches.
  static ChatFormat detect(const std::string& gguf_template);

  explicit ChatTemplate(ChatFormat format) : format_(format), source_("builtin:" + name()) {}
  // The model's Jinja template (throws Error when it does not parse).
  static ChatTemplate from_jinja(const std::string& source);
  ChatFormat format() const { return format_; }
  std::string name() const;
  // For /v1/models: {"source": "gguf" | "builtin:<name>" | "fallback", "format", "warning"?}.
  nlohmann::json describe() const;

  // Whether the template renders the request's tools itself (a Jinja template that reads `tools`).
  // Otherwise tools, tool calls and tool results are written as text (messages_with_tools_as_text).
  bool renders_tools() const;
  // Whether the template refuses tool call ids other than 9 letters and digits (Mistral's): the
  // server then gives its calls such ids, so that a client can send them back.
  bool wants_short_call_ids() const;

  // The conversation as segments, ending where the assistant's answer begins.
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools = {}) const;
  // render() joined to one string (markers as text): what the model reads, for logs and tests.
  // A Jinja template renders with bos_token/eos_token "<s>"/"</s>" here.
  std::string render_text(const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools = {}) const;
  // The Jinja template's text for `messages` with the vocabulary's BOS/EOS texts; throws Error
  // (naming the template line) when the template refuses the conversation.
  std::string render_jinja(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                           const std::vector<ToolDef>& tools = {}) const;
  // Prompt tokens: BOS when the tokenizer adds one, markers as their tokens when the vocabulary has
  // them, the rest encoded as text. A Jinja template's text is encoded with control tokens parsed,
  // after BOS unless the text already starts with it (templates usually print bos_token).
  std::vector<int32_t> encode(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                              const std::vector<ToolDef>& tools = {}) const;
  // Where the assistant's turn ends (EOS always does): marker tokens (when in the vocabulary) and stop
  // strings. A Jinja template's end-of-turn markers are the known ones its source prints.
  std::vector<int32_t> stop_tokens(const Tokenizer& tokenizer) const;
  std::vector<std::string> stop_strings(const Tokenizer& tokenizer) const;

 private:
  std::vector<std::string> jinja_turn_ends() const;

  ChatFormat format_;
  std::shared_ptr<const JinjaTemplate> jinja_;
  std::string jinja_source_;
  std::string source_;   // as describe() reports it
  std::string warning_;  // why the model's template is not used, when it is not
};

}  // namespace tessera::serve
