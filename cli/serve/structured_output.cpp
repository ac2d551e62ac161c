#include "structured_output.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "api_error.h"
#include "tessera/error.h"
#include "tool_calls.h"

namespace tessera::serve {

namespace {

using ojson = nlohmann::ordered_json;

template <class J>
std::string type_of(const J& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "an unsupported value";
}

template <class J>
[[noreturn]] void wrong_type(const std::string& field, const std::string& expected, const J& v) {
  throw bad_field(field, "'" + field + "' must be " + expected + ", got " + type_of(v), "invalid_type");
}

[[noreturn]] void missing(const std::string& field) {
  throw bad_field(field, "'" + field + "' is required", "missing_required_parameter");
}

// A member present and not null, or nullptr.
template <class J>
const J* member(const J& obj, const std::string& key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

template <class J>
void refuse_unknown(const J& obj, const std::string& field, std::initializer_list<const char*> known) {
  for (const auto& item : obj.items()) {
    const std::string& key = item.key();
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) {
      throw bad_field(field + "." + key, "unrecognized field '" + field + "." + key + "'", "unknown_parameter");
    }
  }
}

template <class J>
std::string string_member(const J& obj, const std::string& key, const std::string& field, bool required) {
  const J* v = member(obj, key);
  if (v == nullptr) {
    if (required) missing(field);
    return "";
  }
  if (!v->is_string()) wrong_type(field, "a string", *v);
  return v->template get<std::string>();
}

// OpenAI's rule for function and schema names: a-z, A-Z, 0-9, underscores and dashes, at most 64.
void check_name(const std::string& name, const std::string& field) {
  const bool ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (!ok) {
    throw bad_field(field, "'" + field + "' is \"" + name.substr(0, 80) +
                               "\"; a name is 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'");
  }
}

// response_format: text, json_object or json_schema. Returns the constraint, if any.
std::optional<ConstraintSpec> read_response_format(const ojson& rf) {
  if (!rf.is_object()) wrong_type("response_format", "an object like {\"type\": \"json_object\"}", rf);
  const std::string type = string_member(rf, "type", "response_format.type", true);
  if (type == "text" || type == "json_object") {
    refuse_unknown(rf, "response_format", {"type"});
    if (type == "text") return std::nullopt;
    return ConstraintSpec{"json_object", "", "response_format"};
  }
  if (type != "json_schema") {
    throw bad_field("response_format.type", "'response_format.type' is \"" + type.substr(0, 80) +
                                                "\"; expected text, json_object or json_schema");
  }
  refuse_unknown(rf, "response_format", {"type", "json_schema"});
  const ojson* js = member(rf, std::string("json_schema"));
  if (js == nullptr) missing("response_format.json_schema");
  if (!js->is_object()) wrong_type("response_format.json_schema", "an object with 'name' and 'schema'", *js);
  refuse_unknown(*js, "response_format.json_schema", {"name", "description", "schema", "strict"});
  check_name(string_member(*js, "name", "response_format.json_schema.name", true), "response_format.json_schema.name");
  string_member(*js, "description", "response_format.json_schema.description", false);
  if (const ojson* strict = member(*js, std::string("strict")); strict && !strict->is_boolean()) {
    wrong_type("response_format.json_schema.strict", "a boolean", *strict);
  }
  const ojson* schema = member(*js, std::string("schema"));
  if (schema == nullptr) missing("response_format.json_schema.schema");
  if (!schema->is_object() && !schema->is_boolean()) {
    wrong_type("response_format.json_schema.schema", "a JSON Schema (an object)", *schema);
  }
  return ConstraintSpec{"json_schema", schema->dump(), "response_format.json_schema.schema"};
}

ConstraintSpec read_guided(const std::string& key, const ojson& v) {
  if (key == "guided_json") {
    if (v.is_string()) {
      // A schema as JSON text: checked here, so that a typo is a JSON error, not a schema one.
      ojson parsed = ojson::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
        throw bad_field(key, "'guided_json' is a string that is not a JSON Schema's JSON text");
      }
      return {"json_schema", parsed.dump(), key};
    }
    if (!v.is_object()) wrong_type(key, "a JSON Schema (an object, or its JSON text)", v);
    return {"json_schema", v.dump(), key};
  }
  if (key == "guided_choice") {
    if (!v.is_array()) wrong_type(key, "an array of strings", v);
    if (v.empty()) throw bad_field(key, "'guided_choice' is empty; give at least one choice");
    for (const auto& c : v) {
      if (!c.is_string()) wrong_type(key, "an array of strings", v);
    }
    return {"choice", v.dump(), key};
  }
  if (!v.is_string()) wrong_type(key, "a string", v);
  if (v.get<std::string>().empty()) throw bad_field(key, "'" + key + "' is empty");
  return {key == "guided_regex" ? "regex" : "grammar", v.get<std::string>(), key};
}

ToolDef read_tool(const ojson& t, const std::string& field) {
  if (!t.is_object()) wrong_type(field, "an object like {\"type\": \"function\", \"function\": {...}}", t);
  refuse_unknown(t, field, {"type", "function"});
  const std::string type = string_member(t, "type", field + ".type", true);
  if (type != "function") {
    throw bad_field(field + ".type", "'" + field + ".type' is \"" + type.substr(0, 80) + "\"; only \"function\" tools exist");
  }
  const ojson* fn = member(t, std::string("function"));
  const std::string ff = field + ".function";
  if (fn == nullptr) missing(ff);
  if (!fn->is_object()) wrong_type(ff, "an object with 'name', 'description' and 'parameters'", *fn);
  refuse_unknown(*fn, ff, {"name", "description", "parameters", "strict"});
  ToolDef d;
  d.name = string_member(*fn, "name", ff + ".name", true);
  check_name(d.name, ff + ".name");
  d.description = string_member(*fn, "description", ff + ".description", false);
  if (const ojson* strict = member(*fn, std::string("strict")); strict && !strict->is_boolean()) {
    wrong_type(ff + ".strict", "a boolean", *strict);
  }
  if (const ojson* p = member(*fn, std::string("parameters"))) {
    if (!p->is_object()) wrong_type(ff + ".parameters", "a JSON Schema (an object)", *p);
    d.parameters = *p;
  } else {
    d.parameters = {{"type", "object"}};
  }
  d.tool = t;
  return d;
}

}  // namespace

ojson ordered_structured_fields(std::string_view body) {
  // Other top-level members are dropped as they are read (the request was parsed once already).
  const ojson::parser_callback_t keep = [](int depth, ojson::parse_event_t event, ojson& parsed) {
    if (depth != 1 || event != ojson::parse_event_t::key) return true;
    const std::string& key = parsed.get_ref<const std::string&>();
    return std::any_of(std::begin(kStructuredFields), std::end(kStructuredFields),
                       [&](const char* k) { return key == k; });
  };
  ojson j = ojson::parse(body, keep, /*allow_exceptions=*/false);
  return j.is_object() ? j : ojson::object();
}

void read_structured_output(const ojson& fields, OpenAiRequest& r) {
  std::string first;  // the field that set the constraint
  auto set = [&](const std::string& key, std::optional<ConstraintSpec> spec) {
    if (!spec) return;
    if (!first.empty()) {
      throw bad_field(key, "'" + key + "' and '" + first + "' both constrain the output; give only one");
    }
    first = key;
    r.constraint = std::move(spec);
  };
  if (const ojson* rf = member(fields, std::string("response_format"))) set("response_format", read_response_format(*rf));
  for (const char* key : {"guided_json", "guided_regex", "guided_grammar", "guided_choice"}) {
    if (const ojson* v = member(fields, std::string(key))) set(key, read_guided(key, *v));
  }
}

void read_tools(const ojson& fields, OpenAiRequest& r) {
  if (const ojson* tools = member(fields, std::string("tools"))) {
    if (!tools->is_array()) wrong_type("tools", "an array of tools", *tools);
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string field = "tools[" + std::to_string(i) + "]";
      ToolDef d = read_tool((*tools)[i], field);
      if (!names.insert(d.name).second) {
        throw bad_field(field + ".function.name", "'" + field + ".function.name' repeats the tool name '" + d.name + "'");
      }
      r.tools.push_back(std::move(d));
    }
  }
  if (const ojson* p = member(fields, std::string("parallel_tool_calls"))) {
    if (!p->is_boolean()) wrong_type("parallel_tool_calls", "a boolean", *p);
    r.parallel_tool_calls = p->get<bool>();
  }
  r.tool_choice = r.tools.empty() ? ToolChoice::none : ToolChoice::automatic;
  const ojson* tc = member(fields, std::string("tool_choice"));
  if (tc == nullptr) return;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "none") {
      r.tool_choice = ToolChoice::none;
    } else if (s == "auto") {
      r.tool_choice = r.tools.empty() ? ToolChoice::none : ToolChoice::automatic;
    } else if (s == "required") {
      r.tool_choice = ToolChoice::required;
    } else {
      throw bad_field("tool_choice", "'tool_choice' is \"" + s.substr(0, 80) +
                                         "\"; expected none, auto, required or {\"type\": \"function\", "
                                         "\"function\": {\"name\": ...}}");
    }
  } else if (tc->is_object()) {
    refuse_unknown(*tc, "tool_choice", {"type", "function"});
    const std::string type = string_member(*tc, "type", "tool_choice.type", true);
    if (type != "function") {
      throw bad_field("tool_choice.type", "'tool_choice.type' is \"" + type.substr(0, 80) + "\"; expected \"function\"");
    }
    const ojson* fn = member(*tc, std::string("function"));
    if (fn == nullptr) missing("tool_choice.function");
    if (!fn->is_object()) wrong_type("tool_choice.function", "an object with 'name'", *fn);
    refuse_unknown(*fn, "tool_choice.function", {"name"});
    r.tool_name = string_member(*fn, "name", "tool_choice.function.name", true);
    r.tool_choice = ToolChoice::named;
    const bool known = std::any_of(r.tools.begin(), r.tools.end(), [&](const ToolDef& d) { return d.name == r.tool_name; });
    if (!known) {
      throw bad_field("tool_choice.function.name", "'tool_choice.function.name' is \"" + r.tool_name.substr(0, 80) +
                                                       "\", which is not one of the request's tools");
    }
  } else {
    wrong_type("tool_choice", "a string or an object", *tc);
  }
  if (r.tool_choice == ToolChoice::required && r.tools.empty()) {
    throw bad_field("tool_choice", "'tool_choice' is \"required\" but the request has no 'tools'");
  }
  if ((r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named) && r.constraint) {
    throw bad_field("tool_choice", "'tool_choice' asks for a tool call, which constrains the output, and '" +
                                       r.constraint->where.substr(0, r.constraint->where.find('.')) +
                                       "' constrains it too; give only one");
  }
}

ojson read_message_tool_calls(const nlohmann::json& calls, const std::string& field) {
  if (!calls.is_array()) wrong_type(field, "an array of tool calls", calls);
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const nlohmann::json& c = calls[i];
    const std::string cf = field + "[" + std::to_string(i) + "]";
    if (!c.is_object()) wrong_type(cf, "an object with 'id', 'type' and 'function'", c);
    refuse_unknown(c, cf, {"id", "type", "function"});
    const std::string id = string_member(c, "id", cf + ".id", true);
    const std::string type = string_member(c, "type", cf + ".type", false);
    if (!type.empty() && type != "function") {
      throw bad_field(cf + ".type", "'" + cf + ".type' is \"" + type.substr(0, 80) + "\"; expected \"function\"");
    }
    const nlohmann::json* fn = member(c, std::string("function"));
    if (fn == nullptr) missing(cf + ".function");
    if (!fn->is_object()) wrong_type(cf + ".function", "an object with 'name' and 'arguments'", *fn);
    refuse_unknown(*fn, cf + ".function", {"name", "arguments"});
    const std::string name = string_member(*fn, "name", cf + ".function.name", true);
    ojson args = ojson::object();
    if (const nlohmann::json* a = member(*fn, std::string("arguments"))) {
      if (a->is_string()) {
        args = ojson::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded() || !args.is_object()) {
          throw bad_field(cf + ".function.arguments",
                          "'" + cf + ".function.arguments' must be a JSON object's text, as the model's call gave it");
        }
      } else if (a->is_object()) {
        args = ojson::parse(a->dump());
      } else {
        wrong_type(cf + ".function.arguments", "a string (JSON text)", *a);
      }
    }
    out.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
  }
  return out;
}

std::shared_ptr<const CompiledConstraint> compile_request_constraint(const Constraint& constraint,
                                                                     const OpenAiRequest& r, std::string* kind) {
  const bool call = r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named;
  if (!call && !r.constraint) return nullptr;
  const ConstraintSpec spec =
      call ? tool_call_constraint(r.tools, r.tool_choice == ToolChoice::named ? r.tool_name : "") : *r.constraint;
  if (kind != nullptr) *kind = call ? "tools" : spec.type;
  try {
    return constraint.compile(spec);
  } catch (const Error& e) {
    if (call) {
      // Name the tool at fault: its parameters alone give the same refusal.
      for (size_t i = 0; i < r.tools.size(); ++i) {
        const std::string where = "tools[" + std::to_string(i) + "].function.parameters";
        try {
          constraint.compile({"json_schema", r.tools[i].parameters.dump(), where});
        } catch (const Error& tool_error) {
          throw bad_field(where, tool_error.what());
        }
      }
    }
    throw bad_field(spec.where, e.what());
  }
}

}  // namespace tessera::serve
