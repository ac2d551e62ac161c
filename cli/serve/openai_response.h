// OpenAI response bodies: completions and chat completions, whole or as SSE stream chunks, with usage
// and logprobs.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "openai_request.h"
#include "tessera/engine.h"
#include "tessera/tokenizer.h"

namespace tessera::serve {

// What every object of one response shares.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::completions;
  std::string id;  // cmpl-N / chatcmpl-N
  int64_t created = 0;
  std::string model;
};

// "stop" (EOS, a stop token or string), "length" (max_tokens or the context), else the engine's name.
std::string openai_finish_reason(FinishReason r);
nlohmann::json usage_json(const GenerationResult& r);
// The whole response of a non-streaming request.
nlohmann::json response_json(const ResponseMeta& meta, const GenerationResult& r, const OpenAiRequest& req,
                             const Tokenizer& tok);
// One streaming chunk: text (delta), the role opening a chat stream, or the closing finish reason.
nlohmann::json chunk_json(const ResponseMeta& meta, const std::string& text, const char* role = nullptr,
                          const std::string& finish_reason = "");
// The usage chunk (stream_options.include_usage): no choices.
nlohmann::json usage_chunk_json(const ResponseMeta& meta, const GenerationResult& r);
// "data: JSON\n\n" with invalid UTF-8 replaced.
std::string sse_event(const nlohmann::json& j);
// Text may end inside a UTF-8 sequence while streaming: the length of its longest prefix that does not.
size_t complete_utf8_prefix(const std::string& s);
// Serialises JSON for the wire; invalid UTF-8 in generated text becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);

}  // namespace tessera::serve
