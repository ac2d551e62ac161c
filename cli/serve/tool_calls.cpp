#include "tool_calls.h"

#include <algorithm>
#include <map>
#include <random>
#include <string_view>

namespace tessera::serve {

namespace {

using ojson = nlohmann::ordered_json;

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>", kMistralCalls = "[TOOL_CALLS]";

// The call objects the output consists of, or nullopt when it is anything else.
std::optional<std::vector<ojson>> call_objects(std::string_view s) {
  s = trim(s);
  if (s.starts_with(kMistralCalls)) s = trim(s.substr(kMistralCalls.size()));
  std::vector<ojson> out;
  if (s.starts_with(kCallOpen)) {
    while (!s.empty()) {
      if (!s.starts_with(kCallOpen)) return std::nullopt;  // text between the calls: content, not calls
      s.remove_prefix(kCallOpen.size());
      const size_t end = s.find(kCallClose);
      ojson obj = ojson::parse(s.substr(0, end), nullptr, /*allow_exceptions=*/false);
      if (obj.is_discarded() || !obj.is_object()) return std::nullopt;
      out.push_back(std::move(obj));
      s = end == std::string_view::npos ? std::string_view() : trim(s.substr(end + kCallClose.size()));
    }
    return out;
  }
  if (s.empty() || (s.front() != '{' && s.front() != '[')) return std::nullopt;
  ojson j = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) return std::vector<ojson>{std::move(j)};
  if (!j.is_array() || j.empty()) return std::nullopt;
  for (auto& e : j) {
    if (!e.is_object()) return std::nullopt;
    out.push_back(std::move(e));
  }
  return out;
}

std::string new_call_id(bool short_id) {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = short_id ? "" : "call_";
  for (int i = 0, n = short_id ? 9 : 24; i < n; ++i) id += kChars[rng() % (sizeof kChars - 1)];
  return id;
}

// One call object to a known tool: {"name", "arguments" | "parameters"} and nothing else.
std::optional<ToolCall> read_call(const ojson& obj, const std::vector<ToolDef>& tools, bool short_id) {
  const auto name = obj.find("name");
  if (name == obj.end() || !name->is_string()) return std::nullopt;
  const std::string n = name->get<std::string>();
  if (std::none_of(tools.begin(), tools.end(), [&](const ToolDef& d) { return d.name == n; })) return std::nullopt;
  ojson args = ojson::object();
  for (const auto& [key, value] : obj.items()) {
    if (key == "name") continue;
    if (key != "arguments" && key != "parameters") return std::nullopt;
    args = value;
    if (args.is_string()) args = ojson::parse(value.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) return std::nullopt;
  }
  return ToolCall{new_call_id(short_id), n, args.dump()};
}

}  // namespace

ConstraintSpec tool_call_constraint(const std::vector<ToolDef>& tools, const std::string& only) {
  ojson choices = ojson::array();
  for (const ToolDef& d : tools) {
    if (!only.empty() && d.name != only) continue;
    choices.push_back({{"type", "object"},
                       {"properties", {{"name", {{"const", d.name}}}, {"arguments", d.parameters}}},
                       {"required", {"name", "arguments"}},
                       {"additionalProperties", false}});
  }
  const ojson schema = choices.size() == 1 ? choices[0] : ojson{{"anyOf", choices}};
  return {"json_schema", schema.dump(), "tools"};
}

std::string tools_prompt(const std::vector<ToolDef>& tools) {
  std::string s = "# Tools\n\nYou may call one of these functions:\n";
  for (const ToolDef& d : tools) {
    ojson fn = {{"name", d.name}};
    if (!d.description.empty()) fn["description"] = d.description;
    fn["parameters"] = d.parameters;
    s += fn.dump() + "\n";
  }
  s += "\nTo call a function, answer with only a JSON object: "
       "{\"name\": <function name>, \"arguments\": <an object of its arguments>}.";
  return s;
}

std::vector<ChatMessage> messages_with_tools_as_text(const std::vector<ChatMessage>& messages,
                                                     const std::vector<ToolDef>& tools) {
  std::vector<ChatMessage> out;
  std::map<std::string, std::string> call_names;  // call id -> function name, for the results
  for (const ChatMessage& m : messages) {
    ChatMessage t;
    t.role = m.role;
    t.content = m.content;
    if (m.tool_calls.is_array()) {
      for (const auto& c : m.tool_calls) {
        const ojson call = {{"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}};
        if (!t.content.empty()) t.content += '\n';
        t.content += call.dump();
        call_names[c["id"].get<std::string>()] = c["function"]["name"].get<std::string>();
      }
    }
    if (m.role == "tool") {
      t.role = "user";
      const auto it = call_names.find(m.tool_call_id);
      t.content = it == call_names.end() ? std::string("Tool result: ") : std::string("Result of ").append(it->second).append(": ");
      t.content += m.content;
    }
    out.push_back(std::move(t));
  }
  if (!tools.empty()) {
    if (!out.empty() && out[0].role == "system") {
      out[0].content += "\n\n" + tools_prompt(tools);
    } else {
      ChatMessage system;
      system.role = "system";
      system.content = tools_prompt(tools);
      out.insert(out.begin(), std::move(system));
    }
  }
  return out;
}

std::optional<std::vector<ToolCall>> parse_tool_calls(const std::string& text, const std::vector<ToolDef>& tools,
                                                      bool parallel, bool short_ids) {
  if (tools.empty()) return std::nullopt;
  const auto objects = call_objects(text);
  if (!objects) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const ojson& o : *objects) {
    auto call = read_call(o, tools, short_ids);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  if (!parallel && calls.size() > 1) calls.resize(1);
  return calls;
}

OutputStart classify_output_start(const std::string& text) {
  std::string_view s = text;
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  if (s.empty()) return OutputStart::undecided;
  for (std::string_view marker : {kCallOpen, kMistralCalls}) {
    if (s.size() < marker.size() && marker.starts_with(s)) return OutputStart::undecided;
    if (s.starts_with(marker)) return OutputStart::call;
  }
  return s.front() == '{' || s.front() == '[' ? OutputStart::call : OutputStart::text;
}

nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool delta) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    nlohmann::json c = {{"id", calls[i].id},
                        {"type", "function"},
                        {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (delta) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace tessera::serve
