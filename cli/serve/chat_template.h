// Chat messages -> prompt tokens. The format comes from the GGUF key tokenizer.chat_template when it
// is one of the common patterns, recognised by its markers (a Jinja interpreter would be overkill):
//
//   chatml   <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n      (stop <|im_end|>)
//   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...      (stop <|eot_id|>)
//   llama2   [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...
//   zephyr   <|system|>\ncontent</s>\n<|user|>\ncontent</s>\n<|assistant|>\n
//
// A model without a template (or with one none of these match) gets the documented default:
//
//   default  <|system|>\ncontent\n<|user|>\ncontent\n<|assistant|>\n                  (stop <|user|>)
//
// Markers that are single tokens in the vocabulary (control tokens such as <|im_end|>) are emitted as
// those tokens; text between them is encoded as text. The `chat_template` server setting forces one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "openai_request.h"
#include "tessera/tokenizer.h"

namespace tessera::serve {

enum class ChatFormat { chatml, llama3, llama2, zephyr, fallback };

struct ChatSegment {
  bool special = false;  // a marker to emit as its token when the vocabulary has it
  std::string text;
};

class ChatTemplate {
 public:
  // `setting` is auto | chatml | llama2 | llama3 | zephyr | default; with auto, `gguf_template` (may be
  // empty) decides. `note` receives a line for the log saying what was chosen and why.
  static ChatTemplate choose(const std::string& setting, const std::string& gguf_template, std::string* note);
  // The format's markers recognised in a template text; fallback when none matches.
  static ChatFormat detect(const std::string& gguf_template);

  explicit ChatTemplate(ChatFormat format) : format_(format) {}
  ChatFormat format() const { return format_; }
  std::string name() const;

  // The conversation as segments, ending where the assistant's answer begins.
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages) const;
  // render() joined to one string (markers as text): what the model reads, for logs and tests.
  std::string render_text(const std::vector<ChatMessage>& messages) const;
  // Prompt tokens: BOS when the tokenizer adds one, markers as their tokens when the vocabulary has
  // them, the rest encoded as text.
  std::vector<int32_t> encode(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages) const;
  // Where the assistant's turn ends: marker tokens (when in the vocabulary) and stop strings.
  std::vector<int32_t> stop_tokens(const Tokenizer& tokenizer) const;
  std::vector<std::string> stop_strings(const Tokenizer& tokenizer) const;

 private:
  ChatFormat format_;
};

}  // namespace tessera::serve
