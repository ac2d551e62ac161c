#include "openai_request.h"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "structured_output.h"

namespace tessera::serve {

namespace {

using nlohmann::json;

std::string type_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

[[noreturn]] void wrong_type(const std::string& field, const std::string& expected, const json& v) {
  throw bad_field(field, "'" + field + "' must be " + expected + ", got " + type_of(v), "invalid_type");
}

std::string range_text(double v) {
  if (std::floor(v) == v && std::abs(v) < 1e15) return std::to_string(int64_t(v));
  json j = v;
  return j.dump();
}

// Reads fields off the body, remembering which it saw so the rest can be refused as unknown.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  // A field present and not null.
  const json* get(const std::string& name) {
    seen_.insert(name);
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> number(const std::string& name, double lo, double hi, bool lo_open = false) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) wrong_type(name, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
      throw bad_field(name, "'" + name + "' is " + v->dump() + "; it must be " + (lo_open ? "> " : ">= ") +
                                range_text(lo) + " and <= " + range_text(hi));
    }
    return d;
  }

  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) wrong_type(name, "an integer", *v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      throw bad_field(name, "'" + name + "' is " + v->dump() + "; it must be <= " + std::to_string(hi));
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) {
      throw bad_field(name, "'" + name + "' is " + std::to_string(i) + "; it must be between " + std::to_string(lo) +
                                " and " + std::to_string(hi));
    }
    return i;
  }

  std::optional<bool> boolean(const std::string& name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
    return v->get<bool>();
  }

  std::optional<std::string> string(const std::string& name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) wrong_type(name, "a string", *v);
    return v->get<std::string>();
  }

  void refuse_unknown() const {
    for (const auto& [key, value] : body_.items()) {
      if (!seen_.count(key)) {
        throw bad_field(key, "unrecognized request argument '" + key + "'", "unknown_parameter");
      }
    }
  }

 private:
  const json& body_;
  std::set<std::string> seen_;
};

std::vector<int32_t> token_ids(const json& arr, const std::string& field,
                               const char* expected = "a string or an array of token ids (integers)") {
  std::vector<int32_t> out;
  for (const auto& t : arr) {
    if (!t.is_number_integer()) wrong_type(field, expected, arr);
    if (t.is_number_unsigned() ? t.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())
                               : (t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())) {
      throw bad_field(field, "'" + field + "' holds token id " + t.dump() + ", which is not a valid token id");
    }
    out.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return out;
}

void read_prompt(Fields& f, OpenAiRequest& r) {
  const json* p = f.get("prompt");
  if (p == nullptr) throw bad_field("prompt", "'prompt' is required", "missing_required_parameter");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) wrong_type("prompt", "a string or an array of token ids", *p);
  if (p->empty()) throw bad_field("prompt", "'prompt' is an empty array");
  if ((*p)[0].is_string()) {
    if (p->size() > 1) {
      throw bad_field("prompt", "'prompt' holds " + std::to_string(p->size()) +
                                    " prompts; this server takes one prompt per request");
    }
    r.prompt_text = (*p)[0].get<std::string>();
    return;
  }
  if ((*p)[0].is_array()) {
    if (p->size() > 1) {
      throw bad_field("prompt", "'prompt' holds " + std::to_string(p->size()) +
                                    " prompts; this server takes one prompt per request");
    }
    if ((*p)[0].empty()) throw bad_field("prompt", "'prompt' is an empty array of token ids");
    r.prompt_tokens = token_ids((*p)[0], "prompt");
    return;
  }
  r.prompt_tokens = token_ids(*p, "prompt");
}

std::string message_content(const json& m, const std::string& field) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    throw bad_field(field + ".content", "'" + field + ".content' is required", "missing_required_parameter");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) wrong_type(field + ".content", "a string or an array of text parts", *it);
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    const std::string pf = field + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong_type(pf, "an object like {\"type\": \"text\", \"text\": ...}", part);
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      throw bad_field(pf + ".type", "'" + pf + ".type' is required", "missing_required_parameter");
    }
    if (*type != "text") {
      throw bad_field(pf + ".type", "'" + pf + ".type' is " + type->dump() + "; this server reads only text parts");
    }
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) wrong_type(pf + ".text", "a string", t == part.end() ? json() : *t);
    text += t->get<std::string>();
  }
  return text;
}

void read_messages(Fields& f, OpenAiRequest& r) {
  const json* m = f.get("messages");
  if (m == nullptr) throw bad_field("messages", "'messages' is required", "missing_required_parameter");
  if (!m->is_array()) wrong_type("messages", "an array of messages", *m);
  if (m->empty()) throw bad_field("messages", "'messages' is empty; give at least one message");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string field = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) wrong_type(field, "an object with 'role' and 'content'", msg);
    const auto role = msg.find("role");
    if (role == msg.end() || role->is_null()) {
      throw bad_field(field + ".role", "'" + field + ".role' is required", "missing_required_parameter");
    }
    if (!role->is_string()) wrong_type(field + ".role", "a string", *role);
    if (!roles.count(role->get<std::string>())) {
      throw bad_field(field + ".role", "'" + field + ".role' is " + role->dump() +
                                           "; expected system, developer, user, assistant or tool");
    }
    ChatMessage cm;
    cm.role = role->get<std::string>();
    for (const auto& [key, value] : msg.items()) {
      const bool known = key == "role" || key == "content" || key == "name" ||
                         (key == "tool_calls" && cm.role == "assistant") ||
                         (key == "tool_call_id" && cm.role == "tool");
      if (!known) throw bad_field(field + "." + key, "unrecognized message field '" + key + "'", "unknown_parameter");
    }
    if (cm.role == "developer") cm.role = "system";
    if (const auto calls = msg.find("tool_calls"); calls != msg.end() && !calls->is_null()) {
      cm.tool_calls = read_message_tool_calls(*calls, field + ".tool_calls");
    }
    if (cm.role == "tool") {
      const auto id = msg.find("tool_call_id");
      if (id == msg.end() || id->is_null()) {
        throw bad_field(field + ".tool_call_id", "'" + field + ".tool_call_id' is required", "missing_required_parameter");
      }
      if (!id->is_string()) wrong_type(field + ".tool_call_id", "a string", *id);
      cm.tool_call_id = id->get<std::string>();
    }
    const auto content = msg.find("content");
    if (!cm.tool_calls.is_null() && (content == msg.end() || content->is_null())) {
      cm.null_content = true;  // an assistant turn that only called tools
    } else {
      cm.content = message_content(msg, field);
    }
    r.messages.push_back(std::move(cm));
  }
}

void read_stop(Fields& f, OpenAiRequest& r) {
  const json* s = f.get("stop");
  if (s == nullptr) return;
  if (s->is_string()) {
    if (s->get<std::string>().empty()) throw bad_field("stop", "'stop' is an empty string");
    r.stop.push_back(s->get<std::string>());
    return;
  }
  if (!s->is_array()) wrong_type("stop", "a string or an array of strings", *s);
  if (s->size() > kMaxStops) {
    throw bad_field("stop", "'stop' has " + std::to_string(s->size()) + " strings; at most " +
                                std::to_string(kMaxStops) + " are allowed");
  }
  for (const auto& item : *s) {
    if (!item.is_string()) wrong_type("stop", "a string or an array of strings", *s);
    if (item.get<std::string>().empty()) throw bad_field("stop", "'stop' holds an empty string");
    r.stop.push_back(item.get<std::string>());
  }
}

// Features this server does not have: refused by name rather than ignored.
void refuse_unsupported(Fields& f, Endpoint endpoint) {
  if (auto n = f.integer("n", 1, 128); n && *n != 1) {
    throw bad_field("n", "'n' is " + std::to_string(*n) + "; this server returns one choice per request (n = 1)");
  }
  if (endpoint == Endpoint::completions) {
    if (auto b = f.integer("best_of", 1, 128); b && *b != 1) {
      throw bad_field("best_of", "'best_of' is " + std::to_string(*b) + "; only 1 is supported");
    }
    if (auto e = f.boolean("echo"); e && *e) throw bad_field("echo", "'echo' is not supported");
    if (f.string("suffix")) throw bad_field("suffix", "'suffix' (insertion) is not supported");
  }
  if (const json* lb = f.get("logit_bias")) {
    if (!lb->is_object()) wrong_type("logit_bias", "an object", *lb);
    if (!lb->empty()) throw bad_field("logit_bias", "'logit_bias' is not supported");
  }
  if (endpoint == Endpoint::chat) {
    // The legacy names of tool calling (before `tools`).
    if (const json* t = f.get("functions")) {
      if (!t->is_array()) wrong_type("functions", "an array", *t);
      if (!t->empty()) throw bad_field("functions", "'functions' (legacy function calling) is not supported; use 'tools'");
    }
    if (const json* t = f.get("function_call"); t && !(t->is_string() && *t == "none")) {
      throw bad_field("function_call", "'function_call' (legacy function calling) is not supported; use 'tool_choice'");
    }
  }
}

// A request body: a JSON object.
json parse_body(std::string_view body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number beyond a double (1e400)
    // The parser quotes what it read last, which may be most of a megabyte-long body.
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    throw ApiError(400, "the request body is not valid JSON: " + what, "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object, got " + type_of(j), "", "invalid_json");
  return j;
}

}  // namespace

OpenAiRequest parse_openai_request(Endpoint endpoint, std::string_view body) {
  const json j = parse_body(body);
  OpenAiRequest r;
  r.endpoint = endpoint;
  Fields f(j);
  if (auto m = f.string("model")) r.model = *m;
  if (endpoint == Endpoint::completions) {
    read_prompt(f, r);
  } else {
    read_messages(f, r);
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  r.max_tokens = f.integer("max_tokens", 1, kMaxInt);
  if (endpoint == Endpoint::chat) {
    if (auto m = f.integer("max_completion_tokens", 1, kMaxInt)) {
      if (r.max_tokens && *r.max_tokens != *m) {
        throw bad_field("max_completion_tokens", "'max_tokens' and 'max_completion_tokens' disagree");
      }
      r.max_tokens = m;
      r.max_tokens_field = "max_completion_tokens";
    }
  }
  r.temperature = f.number("temperature", 0, 2);
  r.top_p = f.number("top_p", 0, 1, /*lo_open=*/true);
  if (auto k = f.integer("top_k", -1, kMaxInt)) r.top_k = *k < 0 ? 0 : *k;  // -1 = off, as vLLM
  r.min_p = f.number("min_p", 0, 1);
  r.frequency_penalty = f.number("frequency_penalty", -2, 2);
  r.presence_penalty = f.number("presence_penalty", -2, 2);
  r.repetition_penalty = f.number("repetition_penalty", 0, 10, /*lo_open=*/true);
  if (auto s = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    r.seed = static_cast<uint64_t>(*s);
  }
  if (endpoint == Endpoint::completions) {
    if (auto lp = f.integer("logprobs", 0, kMaxLogprobs)) {
      r.logprobs = true;
      r.top_logprobs = *lp;
    }
  } else {
    r.logprobs = f.boolean("logprobs").value_or(false);
    if (auto top = f.integer("top_logprobs", 0, kMaxLogprobs)) {
      if (!r.logprobs && *top > 0) throw bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      r.top_logprobs = *top;
    }
  }
  read_stop(f, r);
  if (auto u = f.string("user")) {
    if (u->size() > 256) throw bad_field("user", "'user' is longer than 256 characters");
    r.user = *u;
  }
  r.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!r.stream) throw bad_field("stream_options", "'stream_options' needs 'stream': true");
    for (const auto& [key, value] : so->items()) {
      if (key != "include_usage") {
        throw bad_field("stream_options." + key, "unrecognized stream option '" + key + "'", "unknown_parameter");
      }
      if (!value.is_boolean()) wrong_type("stream_options.include_usage", "a boolean", value);
      r.include_usage = value.get<bool>();
    }
  }
  if (r.stream && r.logprobs) {
    throw bad_field("logprobs", "'logprobs' cannot be combined with 'stream': true on this server");
  }
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.priority = f.integer("priority", -kMaxPriority, kMaxPriority).value_or(0);
  refuse_unsupported(f, endpoint);
  // Structured output and tools: read from the body again with object members in their order.
  bool structured = false;
  for (const char* k : kStructuredFields) {
    const bool chat_only = std::string_view(k) == "tools" || std::string_view(k) == "tool_choice" ||
                           std::string_view(k) == "parallel_tool_calls";
    if (chat_only && endpoint != Endpoint::chat) continue;  // refused below as unknown
    structured = (f.get(k) != nullptr) || structured;
  }
  if (structured) {
    const nlohmann::ordered_json fields = ordered_structured_fields(body);
    read_structured_output(fields, r);
    if (endpoint == Endpoint::chat) read_tools(fields, r);
  }
  f.refuse_unknown();
  return r;
}

namespace {

// A small request: its body's fields read by `read` into a T with a `model`, unknown fields refused.
template <class T, class Read>
T parse_small_request(std::string_view body, Read read) {
  const json j = parse_body(body);
  Fields f(j);
  T out;
  if (auto m = f.string("model")) out.model = *m;
  read(j, f, out);
  f.refuse_unknown();
  return out;
}

}  // namespace

TokenizeRequest parse_tokenize_request(std::string_view body) {
  return parse_small_request<TokenizeRequest>(body, [](const json& j, Fields& f, TokenizeRequest& t) {
    const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
    if (has_prompt == (j.contains("messages") && !j["messages"].is_null())) {
      throw bad_field(has_prompt ? "messages" : "prompt", "give either 'prompt' (a text) or 'messages' (a chat)",
                      has_prompt ? "invalid_value" : "missing_required_parameter");
    }
    if (has_prompt) {
      t.text = *f.string("prompt");
    } else {
      OpenAiRequest chat;
      read_messages(f, chat);
      t.chat = true;
      t.messages = std::move(chat.messages);
    }
    t.add_special_tokens = f.boolean("add_special_tokens").value_or(true);
  });
}

DetokenizeRequest parse_detokenize_request(std::string_view body) {
  return parse_small_request<DetokenizeRequest>(body, [](const json&, Fields& f, DetokenizeRequest& d) {
    const json* tokens = f.get("tokens");
    if (tokens == nullptr) throw bad_field("tokens", "'tokens' is required", "missing_required_parameter");
    if (!tokens->is_array()) wrong_type("tokens", "an array of token ids", *tokens);
    d.tokens = token_ids(*tokens, "tokens", "an array of token ids (integers)");
  });
}

}  // namespace tessera::serve
