#include "openai_response.h"

namespace tessera::serve {

using nlohmann::json;

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// Whether s is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
// U+10FFFF), as the JSON writer checks it.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    const auto c1 = static_cast<unsigned char>(s[i + (len > 1 ? 1 : 0)]);
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) {
      return false;
    }
    i += len;
  }
  return true;
}

// A token as logprobs name it, and its bytes: its text; a control token (EOS, which adds no text)
// its vocabulary entry ("</s>", as vLLM shows it); a piece that is not UTF-8 on its own (a byte
// token, part of a character) as OpenAI writes those, "bytes:\xe2\x80", with its raw bytes, so
// that two such tokens never become the same U+FFFD key.
struct TokenName {
  std::string name, bytes;
};
TokenName token_name(const Tokenizer& tok, int32_t id) {
  std::string piece = tok.token_to_piece(id);
  if (piece.empty()) {
    const std::string& entry = tok.vocabulary().tokens[size_t(id)];
    return {entry, entry};
  }
  if (valid_utf8(piece)) return {piece, piece};
  static const char kHex[] = "0123456789abcdef";
  std::string name = "bytes:";
  for (unsigned char c : piece) name += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
  return {name, piece};
}

// The tokens that make up the answer's text: those that start before its end. A matched stop string
// cuts the text, and the tokens that brought it (or follow it in the same step) are not part of the
// answer: their logprobs would not line up with the text (usage still counts every generated token).
size_t answer_tokens(const GenerationResult& r, const Tokenizer& tok) {
  if (r.reason != FinishReason::stop) return r.tokens.size();
  size_t offset = 0, n = 0;
  while (n < r.tokens.size() && offset < r.text.size()) offset += tok.token_to_piece(r.tokens[n++]).size();
  return n;
}

// Completions' legacy shape: parallel arrays of tokens, their logprobs, the top alternatives and the
// offset of each token in the text.
json completion_logprobs(const GenerationResult& r, const Tokenizer& tok) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;  // in characters of the text, as OpenAI's (Python) offsets count
  for (size_t i = 0, n = answer_tokens(r, tok); i < n; ++i) {
    const std::string name = token_name(tok, r.tokens[i]).name;
    tokens.push_back(name);
    lps.push_back(i < r.logprobs.size() ? json(r.logprobs[i]) : json());
    offsets.push_back(offset);
    for (unsigned char c : tok.token_to_piece(r.tokens[i])) offset += (c & 0xC0) != 0x80 ? 1 : 0;
    // The N most likely tokens and, as OpenAI's legacy API does ("up to logprobs + 1"), the chosen one.
    json top = json::object();
    if (i < r.top_logprobs.size()) {
      for (const TokenLogprob& t : r.top_logprobs[i]) {
        const std::string key = token_name(tok, t.token).name;
        if (!top.contains(key)) top[key] = t.logprob;  // most likely first
      }
    }
    if (i < r.logprobs.size() && !top.contains(name)) top[name] = r.logprobs[i];
    tops.push_back(top);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const GenerationResult& r, const Tokenizer& tok) {
  json content = json::array();
  for (size_t i = 0, n = answer_tokens(r, tok); i < n; ++i) {
    const TokenName chosen = token_name(tok, r.tokens[i]);
    json top = json::array();
    if (i < r.top_logprobs.size()) {
      for (const TokenLogprob& t : r.top_logprobs[i]) {
        const TokenName alt = token_name(tok, t.token);
        top.push_back({{"token", alt.name}, {"logprob", t.logprob}, {"bytes", bytes_of(alt.bytes)}});
      }
    }
    content.push_back({{"token", chosen.name},
                       {"logprob", i < r.logprobs.size() ? json(r.logprobs[i]) : json()},
                       {"bytes", bytes_of(chosen.bytes)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace

std::string openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::eos:
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    default: return std::string(finish_reason_name(r));
  }
}

json usage_json(const GenerationResult& r) {
  const auto in = int64_t(r.prompt.size()), out = int64_t(r.tokens.size());
  return {{"prompt_tokens", in},
          {"completion_tokens", out},
          {"total_tokens", in + out},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

json response_json(const ResponseMeta& meta, const GenerationResult& r, const OpenAiRequest& req,
                   const Tokenizer& tok) {
  json choice = {{"index", 0}, {"finish_reason", openai_finish_reason(r.reason)}, {"logprobs", nullptr}};
  json j = {{"id", meta.id}, {"created", meta.created}, {"model", meta.model}};
  if (meta.endpoint == Endpoint::completions) {
    j["object"] = "text_completion";
    choice["text"] = r.text;
    if (req.logprobs) choice["logprobs"] = completion_logprobs(r, tok);
  } else {
    j["object"] = "chat.completion";
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    if (req.logprobs) choice["logprobs"] = chat_logprobs(r, tok);
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(r);
  return j;
}

json chunk_json(const ResponseMeta& meta, const std::string& text, const char* role, const std::string& finish_reason) {
  json choice = {{"index", 0}, {"logprobs", nullptr},
                 {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}};
  json j = {{"id", meta.id}, {"created", meta.created}, {"model", meta.model}};
  if (meta.endpoint == Endpoint::completions) {
    j["object"] = "text_completion";
    choice["text"] = text;
  } else {
    j["object"] = "chat.completion.chunk";
    json delta = json::object();
    if (role != nullptr) delta["role"] = role;
    if (!text.empty() || role != nullptr) delta["content"] = text;
    choice["delta"] = delta;
  }
  j["choices"] = json::array({choice});
  return j;
}

json usage_chunk_json(const ResponseMeta& meta, const GenerationResult& r) {
  return {{"id", meta.id},
          {"object", meta.endpoint == Endpoint::completions ? "text_completion" : "chat.completion.chunk"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array()},
          {"usage", usage_json(r)}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

size_t complete_utf8_prefix(const std::string& s) {
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

}  // namespace tessera::serve
