// The body of POST /v1/completions and /v1/chat/completions, parsed and checked. Every rule names the
// field it applies to, so a bad request gets a 400 that says which field and why. Fields a request
// leaves out stay empty here and take the server's defaults later.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/constraint.h"

namespace tessera::serve {

enum class Endpoint { completions, chat };

struct ChatMessage {
  std::string role;  // system (developer too), user, assistant, tool
  std::string content;
  bool null_content = false;  // an assistant message with tool calls and `content: null`
  std::string tool_call_id;   // role tool: the call it answers
  // Role assistant: [{"id", "type": "function", "function": {"name", "arguments": OBJECT}}] with the
  // arguments parsed from their JSON text, as chat templates expect them; null: no tool calls.
  nlohmann::ordered_json tool_calls;
};

// One of the request's `tools` (a function).
struct ToolDef {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // its JSON Schema; {"type": "object"} when not given
  nlohmann::ordered_json tool;        // the tool as the client sent it, for chat templates
};

// tool_choice: none (no call), auto (the model decides; calls are parsed from its output),
// required (one call to any tool, constrained), named (a call to `tool_name`, constrained).
enum class ToolChoice { none, automatic, required, named };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::completions;
  std::string model;  // empty: not given
  // completions: a prompt as text or as token ids
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_tokens;
  // chat
  std::vector<ChatMessage> messages;

  std::optional<int64_t> max_tokens;
  std::string max_tokens_field = "max_tokens";  // or chat's max_completion_tokens, as the client sent it
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  std::optional<double> frequency_penalty, presence_penalty, repetition_penalty;
  std::optional<uint64_t> seed;
  // completions: `logprobs: N`; chat: `logprobs: true` with `top_logprobs: N`
  bool logprobs = false;
  int64_t top_logprobs = 0;
  std::vector<std::string> stop;
  std::string user;  // empty: not given
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (as vLLM): generate max_tokens whatever the model says
  int64_t priority = 0;        // extension (as vLLM): lower is served first (schedulers with priorities)

  // Structured output: response_format (json_object, json_schema) or one of vLLM's guided_json,
  // guided_regex, guided_grammar, guided_choice; `where` names the field. Unset: free text.
  std::optional<ConstraintSpec> constraint;
  // chat: tools and tool_choice (default auto with tools, none without).
  std::vector<ToolDef> tools;
  ToolChoice tool_choice = ToolChoice::none;
  std::string tool_name;  // tool_choice named
  bool parallel_tool_calls = true;
};

// Largest values accepted (OpenAI's limits where it has one).
inline constexpr int64_t kMaxLogprobs = 20;
inline constexpr int64_t kMaxPriority = 1000000;
inline constexpr size_t kMaxStops = 16;

// Throws ApiError (400) naming the field: malformed JSON, a body that is not an object, a missing or
// ill-typed field, a value out of range, an unknown field or an unsupported feature (n > 1, tools...).
OpenAiRequest parse_openai_request(Endpoint endpoint, std::string_view body);

// POST /tokenize (as vLLM's): a text `prompt` or chat `messages`, to the token ids a generation
// request with them would start from; `add_special_tokens` (default true) puts BOS before a text.
struct TokenizeRequest {
  std::string model;
  bool chat = false;
  std::string text;
  std::vector<ChatMessage> messages;
  bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize_request(std::string_view body);

// POST /detokenize: `tokens`, an array of token ids, to their text.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body);

}  // namespace tessera::serve
