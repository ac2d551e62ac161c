#include "chat_template.h"

#include <algorithm>

#include "tessera/error.h"
#include "tool_calls.h"

namespace tessera::serve {

namespace {

// The id of a token whose text is exactly `text`, or -1.
int32_t find_token(const Tokenizer& tok, const std::string& text) {
  const auto& tokens = tok.vocabulary().tokens;
  const auto it = std::find(tokens.begin(), tokens.end(), text);
  return it == tokens.end() ? -1 : static_cast<int32_t>(it - tokens.begin());
}

std::string token_text(const Tokenizer& tok, int32_t id) {
  return id >= 0 && id < tok.vocab_size() ? tok.vocabulary().tokens[size_t(id)] : std::string();
}

// A Jinja template's text for the conversation, as transformers renders it for generation: tool
// calls with their arguments as objects, tool results with their call's id, tools as sent.
std::string render_with(const JinjaTemplate& t, const std::vector<ChatMessage>& messages,
                        const std::vector<ToolDef>& tools, const std::string& bos, const std::string& eos) {
  ChatTemplateInputs in;
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json msg = {{"role", m.role}, {"content", m.null_content ? nlohmann::ordered_json() : nlohmann::ordered_json(m.content)}};
    if (!m.tool_calls.is_null()) msg["tool_calls"] = m.tool_calls;
    if (m.role == "tool") msg["tool_call_id"] = m.tool_call_id;
    in.messages.push_back(std::move(msg));
  }
  if (!tools.empty()) {
    in.tools = nlohmann::ordered_json::array();
    for (const ToolDef& d : tools) in.tools.push_back(d.tool);
  }
  in.add_generation_prompt = true;
  in.bos_token = bos;
  in.eos_token = eos;
  return render_chat_template(t, in);
}

std::string eos_text(const Tokenizer& tok) {
  return tok.eos() >= 0 ? tok.vocabulary().tokens[size_t(tok.eos())] : std::string("</s>");
}

// The end-of-turn marker of a format ("" = the model's EOS ends the turn).
std::string turn_end(ChatFormat f) {
  switch (f) {
    case ChatFormat::chatml: return "<|im_end|>";
    case ChatFormat::llama3: return "<|eot_id|>";
    default: return "";
  }
}

}  // namespace

ChatFormat ChatTemplate::detect(const std::string& t) {
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::chatml;
  if (t.find("<|start_header_id|>") != std::string::npos) return ChatFormat::llama3;
  if (t.find("[INST]") != std::string::npos) return ChatFormat::llama2;
  if (t.find("<|user|>") != std::string::npos) return ChatFormat::zephyr;
  return ChatFormat::fallback;
}

ChatTemplate ChatTemplate::from_jinja(const std::string& source) {
  ChatTemplate t(ChatFormat::jinja);
  t.jinja_ = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(source, "tokenizer.chat_template"));
  t.jinja_source_ = source;
  t.source_ = "gguf";
  // A template that cannot render a plain user turn (an unsupported construct) is no use.
  ChatMessage hello;
  hello.role = "user";
  hello.content = "Hello";
  t.render_text({hello});
  return t;
}

ChatTemplate ChatTemplate::choose(const std::string& setting, const std::string& gguf_template, std::string* note) {
  auto say = [&](const std::string& s) {
    if (note != nullptr) *note = s;
  };
  if (setting == "chatml") return ChatTemplate(ChatFormat::chatml);
  if (setting == "llama3") return ChatTemplate(ChatFormat::llama3);
  if (setting == "llama2") return ChatTemplate(ChatFormat::llama2);
  if (setting == "zephyr") return ChatTemplate(ChatFormat::zephyr);
  if (setting == "default") return ChatTemplate(ChatFormat::fallback);
  if (setting == "jinja") {
    if (gguf_template.empty()) throw Error("chat_template is 'jinja' but the model has no tokenizer.chat_template");
    ChatTemplate t = from_jinja(gguf_template);  // its errors stop the server: jinja was asked for
    say("chat template: the model's tokenizer.chat_template (Jinja)");
    return t;
  }
  if (setting != "auto") {
    throw Error("chat_template is '" + setting + "'; expected auto, jinja, chatml, llama2, llama3, zephyr or default");
  }
  if (gguf_template.empty()) {
    say("the model has no tokenizer.chat_template; chat uses the default template");
    return ChatTemplate(ChatFormat::fallback);
  }
  try {
    ChatTemplate t = from_jinja(gguf_template);
    say("chat template: the model's tokenizer.chat_template (Jinja)");
    return t;
  } catch (const Error& e) {
    ChatTemplate t(ChatFormat::fallback);
    t.source_ = "fallback";
    t.warning_ = std::string("the model's tokenizer.chat_template cannot be used (") + e.what() + ")";
    say("warning: " + t.warning_ + "; chat uses the default template (set server.chat_template to choose one)");
    return t;
  }
}

nlohmann::json ChatTemplate::describe() const {
  nlohmann::json d = {{"source", source_}, {"format", name()}};
  if (!warning_.empty()) d["warning"] = warning_;
  return d;
}

std::string ChatTemplate::name() const {
  switch (format_) {
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::llama3: return "llama3";
    case ChatFormat::llama2: return "llama2";
    case ChatFormat::zephyr: return "zephyr";
    case ChatFormat::fallback: return "default";
    case ChatFormat::jinja: return "jinja";
  }
  return "?";
}

bool ChatTemplate::renders_tools() const {
  return format_ == ChatFormat::jinja && jinja_source_.find("tools") != std::string::npos;
}

bool ChatTemplate::wants_short_call_ids() const {
  return format_ == ChatFormat::jinja && jinja_source_.find("alphanumeric strings with length 9") != std::string::npos;
}

std::vector<ChatSegment> ChatTemplate::render(const std::vector<ChatMessage>& request_messages,
                                              const std::vector<ToolDef>& tools) const {
  const bool as_text = !renders_tools();
  const std::vector<ChatMessage> messages =
      as_text ? messages_with_tools_as_text(request_messages, tools) : request_messages;
  std::vector<ChatSegment> out;
  auto text = [&](const std::string& s) {
    if (s.empty()) return;
    if (!out.empty() && !out.back().special) {
      out.back().text += s;
    } else {
      out.push_back({false, s});
    }
  };
  auto special = [&](const std::string& s) { out.push_back({true, s}); };

  switch (format_) {
    case ChatFormat::chatml:
      for (const auto& m : messages) {
        special("<|im_start|>");
        text(m.role + "\n" + m.content);
        special("<|im_end|>");
        text("\n");
      }
      special("<|im_start|>");
      text("assistant\n");
      break;
    case ChatFormat::llama3:
      for (const auto& m : messages) {
        special("<|start_header_id|>");
        text(m.role);
        special("<|end_header_id|>");
        text("\n\n" + m.content);
        special("<|eot_id|>");
      }
      special("<|start_header_id|>");
      text("assistant");
      special("<|end_header_id|>");
      text("\n\n");
      break;
    case ChatFormat::llama2: {
      // The system prompt goes inside the first [INST]; each answered turn ends with EOS and the next
      // begins with BOS (the first BOS is the tokenizer's).
      std::string system;
      bool first = true, open = false;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += (system.empty() ? "" : "\n") + m.content;
        } else if (m.role == "user") {
          if (!first) special("<s>");
          std::string inst = "[INST] ";
          if (!system.empty()) inst += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
          system.clear();
          text(inst + m.content + " [/INST]");
          first = false;
          open = true;
        } else {  // assistant
          text(" " + m.content + " ");
          special("</s>");
          open = false;
        }
      }
      if (!open && !system.empty()) text("[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n [/INST]");
      break;
    }
    case ChatFormat::zephyr:
      for (const auto& m : messages) {
        text("<|" + m.role + "|>\n" + m.content);
        special("</s>");
        text("\n");
      }
      text("<|assistant|>\n");
      break;
    case ChatFormat::fallback:
      for (const auto& m : messages) text("<|" + m.role + "|>\n" + m.content + "\n");
      text("<|assistant|>\n");
      break;
    case ChatFormat::jinja: text(render_with(*jinja_, messages, as_text ? std::vector<ToolDef>{} : tools, "<s>", "</s>")); break;
  }
  return out;
}

std::string ChatTemplate::render_text(const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools) const {
  std::string s;
  for (const auto& seg : render(messages, tools)) s += seg.text;
  return s;
}

std::string ChatTemplate::render_jinja(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                       const std::vector<ToolDef>& tools) const {
  if (!jinja_) throw Error("chat template '" + name() + "' is not a Jinja template");
  if (!renders_tools()) {
    return render_with(*jinja_, messages_with_tools_as_text(messages, tools), {}, token_text(tok, tok.bos()),
                       token_text(tok, tok.eos()));
  }
  return render_with(*jinja_, messages, tools, token_text(tok, tok.bos()), token_text(tok, tok.eos()));
}

std::vector<int32_t> ChatTemplate::encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                          const std::vector<ToolDef>& tools) const {
  std::vector<int32_t> ids;
  if (format_ == ChatFormat::jinja) {
    const std::string text = render_jinja(tok, messages, tools);
    const std::string bos = token_text(tok, tok.bos());
    // Templates usually print bos_token themselves; BOS is added only when the text lacks it.
    if (tok.vocabulary().add_bos && tok.bos() >= 0 && (bos.empty() || text.rfind(bos, 0) != 0)) ids.push_back(tok.bos());
    const std::vector<int32_t> t = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
    ids.insert(ids.end(), t.begin(), t.end());
    return ids;
  }
  if (tok.vocabulary().add_bos && tok.bos() >= 0) ids.push_back(tok.bos());
  std::string pending;  // text, including markers the vocabulary lacks, encoded in one piece
  auto flush = [&] {
    if (pending.empty()) return;
    const std::vector<int32_t> t = tok.encode(pending, false);
    ids.insert(ids.end(), t.begin(), t.end());
    pending.clear();
  };
  for (const ChatSegment& seg : render(messages, tools)) {
    std::string marker = seg.text;
    if (seg.special && marker == "</s>") marker = eos_text(tok);
    if (seg.special && marker == "<s>" && tok.bos() >= 0) marker = tok.vocabulary().tokens[size_t(tok.bos())];
    const int32_t id = seg.special ? find_token(tok, marker) : -1;
    if (id >= 0) {
      flush();
      ids.push_back(id);
    } else {
      pending += seg.text;
    }
  }
  flush();
  return ids;
}

std::vector<std::string> ChatTemplate::jinja_turn_ends() const {
  static const char* const kTurnEnds[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>",
                                          "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>",
                                          "<|endoftext|>", "<|end_of_text|>"};
  std::vector<std::string> out;
  for (const char* m : kTurnEnds) {
    if (jinja_source_.find(m) != std::string::npos) out.emplace_back(m);
  }
  return out;
}

std::vector<int32_t> ChatTemplate::stop_tokens(const Tokenizer& tok) const {
  if (format_ == ChatFormat::jinja) {
    std::vector<int32_t> ids;
    for (const std::string& m : jinja_turn_ends()) {
      const int32_t id = find_token(tok, m);
      if (id >= 0 && id != tok.eos()) ids.push_back(id);  // EOS ends every turn already
    }
    return ids;
  }
  const std::string end = turn_end(format_);
  if (end.empty()) return {};
  const int32_t id = find_token(tok, end);
  if (id < 0) return {};
  return {id};
}

std::vector<std::string> ChatTemplate::stop_strings(const Tokenizer& tok) const {
  if (format_ == ChatFormat::jinja) {
    std::vector<std::string> out;
    for (const std::string& m : jinja_turn_ends()) {
      if (find_token(tok, m) < 0) out.push_back(m);
    }
    return out;
  }
  const std::string end = turn_end(format_);
  if (!end.empty()) {
    if (find_token(tok, end) >= 0) return {};  // the token ends the turn
    return {end};
  }
  if (format_ == ChatFormat::zephyr || format_ == ChatFormat::fallback) return {"<|user|>"};
  return {};
}

}  // namespace tessera::serve
