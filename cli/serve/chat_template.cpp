#include "chat_template.h"

#include <algorithm>

#include "tessera/error.h"

namespace tessera::serve {

namespace {

// The id of a token whose text is exactly `text`, or -1.
int32_t find_token(const Tokenizer& tok, const std::string& text) {
  const auto& tokens = tok.vocabulary().tokens;
  const auto it = std::find(tokens.begin(), tokens.end(), text);
  return it == tokens.end() ? -1 : static_cast<int32_t>(it - tokens.begin());
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

ChatTemplate ChatTemplate::choose(const std::string& setting, const std::string& gguf_template, std::string* note) {
  auto say = [&](const std::string& s) {
    if (note != nullptr) *note = s;
  };
  if (setting == "chatml") return ChatTemplate(ChatFormat::chatml);
  if (setting == "llama3") return ChatTemplate(ChatFormat::llama3);
  if (setting == "llama2") return ChatTemplate(ChatFormat::llama2);
  if (setting == "zephyr") return ChatTemplate(ChatFormat::zephyr);
  if (setting == "default") return ChatTemplate(ChatFormat::fallback);
  if (setting != "auto") {
    throw Error("chat_template is '" + setting + "'; expected auto, chatml, llama2, llama3, zephyr or default");
  }
  if (gguf_template.empty()) {
    say("the model has no tokenizer.chat_template; chat uses the default template");
    return ChatTemplate(ChatFormat::fallback);
  }
  const ChatFormat f = detect(gguf_template);
  ChatTemplate t(f);
  if (f == ChatFormat::fallback) {
    say("the model's tokenizer.chat_template matches none of chatml, llama2, llama3, zephyr; chat uses the "
        "default template (set server.chat_template to choose one)");
  } else {
    say("chat template: " + t.name() + " (recognised in the model's tokenizer.chat_template)");
  }
  return t;
}

std::string ChatTemplate::name() const {
  switch (format_) {
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::llama3: return "llama3";
    case ChatFormat::llama2: return "llama2";
    case ChatFormat::zephyr: return "zephyr";
    case ChatFormat::fallback: return "default";
  }
  return "?";
}

std::vector<ChatSegment> ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
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
  }
  return out;
}

std::string ChatTemplate::render_text(const std::vector<ChatMessage>& messages) const {
  std::string s;
  for (const auto& seg : render(messages)) s += seg.text;
  return s;
}

std::vector<int32_t> ChatTemplate::encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages) const {
  std::vector<int32_t> ids;
  if (tok.vocabulary().add_bos && tok.bos() >= 0) ids.push_back(tok.bos());
  std::string pending;  // text, including markers the vocabulary lacks, encoded in one piece
  auto flush = [&] {
    if (pending.empty()) return;
    const std::vector<int32_t> t = tok.encode(pending, false);
    ids.insert(ids.end(), t.begin(), t.end());
    pending.clear();
  };
  for (const ChatSegment& seg : render(messages)) {
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

std::vector<int32_t> ChatTemplate::stop_tokens(const Tokenizer& tok) const {
  const std::string end = turn_end(format_);
  if (end.empty()) return {};
  const int32_t id = find_token(tok, end);
  if (id < 0) return {};
  return {id};
}

std::vector<std::string> ChatTemplate::stop_strings(const Tokenizer& tok) const {
  const std::string end = turn_end(format_);
  if (!end.empty()) {
    if (find_token(tok, end) >= 0) return {};  // the token ends the turn
    return {end};
  }
  if (format_ == ChatFormat::zephyr || format_ == ChatFormat::fallback) return {"<|user|>"};
  return {};
}

}  // namespace tessera::serve
