#include "json_schema_gbnf.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <vector>

#include "gbnf_text.h"
#include "grammar.h"
#include "json_pointer.h"
#include "number_range_gbnf.h"
#include "regex_gbnf.h"
#include "string_format_gbnf.h"
#include "tessera/error.h"

namespace tessera::grammar {

namespace {

using Json = nlohmann::ordered_json;

// Validators ignore these (they describe, they do not constrain). definitions/$defs only hold schemas
// that $ref reaches; they are converted when referenced.
const std::set<std::string, std::less<>> kAnnotations = {
    "$schema", "$id", "id", "title", "description", "examples", "example", "default", "$comment",
    "deprecated", "readOnly", "writeOnly", "definitions", "$defs", "contentMediaType", "contentEncoding",
    "contentSchema", "$anchor", "$dynamicAnchor", "$vocabulary", "markdownDescription", "enumDescriptions",
    "markdownEnumDescriptions", "deprecationMessage", "doNotSuggest", "defaultSnippets", "errorMessage",
    "discriminator", "xml", "externalDocs"};
// JSON Schema keywords (any draft) that constrain instances in ways this converter does not generate.
const std::set<std::string, std::less<>> kRefused = {
    "not", "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains",
    "minContains", "maxContains", "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "extends",
    "disallow", "divisibleBy"};
const std::set<std::string, std::less<>> kObjectKeywords = {"properties", "required", "additionalProperties",
                                                            "patternProperties", "minProperties", "maxProperties"};
const std::set<std::string, std::less<>> kArrayKeywords = {"items", "prefixItems", "additionalItems",
                                                           "minItems", "maxItems", "uniqueItems"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string, std::less<>> kNumberKeywords = {"minimum", "maximum", "exclusiveMinimum",
                                                            "exclusiveMaximum", "multipleOf"};
const std::set<std::string, std::less<>> kHandled = {
    "type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf", "nullable", "properties", "required", "patternProperties",
    "additionalProperties", "minProperties", "maxProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
const char* const kTypes[] = {"null", "boolean", "object", "array", "number", "string", "integer"};

// Compact JSON, any value. char: one escaped or plain string character; \u escapes of surrogates are
// left out so each accepted unit is exactly one code point (what minLength/maxLength count).
const char* const kPrimitives[][2] = {
    {"value", "object | array | string | number | \"true\" | \"false\" | \"null\""},
    {"object", "\"{\" (string \":\" value (\",\" string \":\" value)*)? \"}\""},
    {"array", "\"[\" (value (\",\" value)*)? \"]\""},
    {"string", "\"\\\"\" char* \"\\\"\""},
    {"char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-C] [0-9a-fA-F]{3} | "
             "[dD] [0-7] [0-9a-fA-F]{2} | [eEfF] [0-9a-fA-F]{3}))"},
    // At most 15 integer digits, 16 fraction digits and a 2-digit exponent: every number is a finite
    // double (1e999 is JSON, yet many parsers refuse it) and integers are exact in a double.
    {"number", "integer (\".\" [0-9]{1,16})? ([eE] [+\\-]? [0-9]{1,2})?"},
    {"integer", "\"-\"? (\"0\" | [1-9] [0-9]{0,14})"},
    {"boolean", "\"true\" | \"false\""},
    {"null", "\"null\""},
    // Keys of extra members: no escapes but \" and \\, so a key has one spelling and can be told apart
    // from the listed names.
    {"key-char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\\\"\" | \"\\\\\\\\\""},
};

// A branch of anyOf that contradicts its siblings is dropped, not an error.
struct Unsatisfiable : Error {
  using Error::Error;
};

// True when no key can match both patterns: both are anchored and their literal prefixes differ.
bool disjoint_patterns(const std::string& a, const std::string& b) {
  auto prefix = [](const std::string& p) -> std::optional<std::string> {
    if (p.empty() || p[0] != '^') return std::nullopt;
    std::string out;
    for (size_t i = 1; i < p.size(); ++i) {
      const char c = p[i];
      if (std::string_view("\\.[](){}*+?|^$").find(c) != std::string_view::npos) {
        // A quantifier makes the character before it optional or repeated: not part of the prefix.
        if ((c == '*' || c == '+' || c == '?' || c == '{') && !out.empty()) out.pop_back();
        break;
      }
      out += c;
    }
    return out;
  };
  const auto pa = prefix(a), pb = prefix(b);
  if (!pa || !pb) return false;
  const size_t n = std::min(pa->size(), pb->size());
  return pa->compare(0, n, *pb, 0, n) != 0;
}

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string at(const std::string& ptr) { return ptr.empty() ? "/" : ptr; }

[[noreturn]] void refuse_keyword(const std::string& key, const std::string& ptr) {
  throw Error("json_schema: unsupported keyword '" + key + "' at " + at(ptr));
}
[[noreturn]] void bad_value(const std::string& key, const std::string& ptr, const std::string& why) {
  throw Error("json_schema: keyword '" + key + "' at " + at(ptr) + " " + why);
}

bool is_annotation(const std::string& key) {
  return kAnnotations.count(key) || key.rfind("x-", 0) == 0 || (!kHandled.count(key) && !kRefused.count(key));
}

bool only_annotations(const Json& s, std::initializer_list<const char*> also) {
  for (const auto& [k, v] : s.items()) {
    bool skip = is_annotation(k);
    for (const char* a : also) skip = skip || k == a;
    if (!skip) return false;
  }
  return true;
}

std::string list_text(const std::vector<std::string>& parts) {
  if (parts.empty()) return "";
  if (parts.size() == 1) return parts.front();
  std::string out = "(";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? " | " : "") + parts[i];
  return out + ")";
}

std::optional<uint64_t> count_value_raw(const Json& s, const char* key, const std::string& ptr);

// A count keyword's value. Upper bounds above the parser's repetition limit are lowered to it (a valid
// subset: nobody waits for a 10,000-character string); lower bounds above it are refused.
std::optional<uint64_t> count_value(const Json& s, const char* key, const std::string& ptr) {
  const auto v = count_value_raw(s, key, ptr);
  if (!v || *v <= kMaxRepetition) return v;
  if (std::string_view(key).substr(0, 3) == "max") return kMaxRepetition;
  bad_value(key, ptr, "is above the supported " + std::to_string(kMaxRepetition));
}

std::optional<uint64_t> count_value_raw(const Json& s, const char* key, const std::string& ptr) {
  if (!s.contains(key)) return std::nullopt;
  const Json& v = s.at(key);
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) return v.get<uint64_t>();
  if (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>() &&
      v.get<double>() < 1e15)
    return static_cast<uint64_t>(v.get<double>());
  bad_value(key, ptr, "must be a non-negative integer");
}

// Code points of a JSON string value (what minLength/maxLength count).
size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

class Converter {
 public:
  Converter(const Json& root, const JsonSchemaOptions& options) : root_(root), options_(options) {
    for (const auto& p : kPrimitives) names_.insert(p[0]);
    names_.insert("root");
  }

  std::string run() {
    const std::string body = visit(root_, "", "root");
    std::string out = "root ::= " + body + "\n";
    for (const auto& [name, rule_body] : rules_) out += name + " ::= " + rule_body + "\n";
    for (const auto& p : kPrimitives)
      if (used_primitives_.count(p[0])) out += std::string(p[0]) + " ::= " + p[1] + "\n";
    return out;
  }

 private:
  const Json& root_;
  JsonSchemaOptions options_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> names_;
  std::set<std::string> used_primitives_;
  std::map<std::string, std::string> ref_rules_;
  int merge_depth_ = 0;

  std::string prim(const std::string& name) {
    if (!used_primitives_.insert(name).second) return name;
    if (name == "value") for (const char* p : {"object", "array", "string", "number"}) prim(p);
    if (name == "object") { prim("string"); prim("value"); }
    if (name == "array") prim("value");
    if (name == "string") prim("char");
    if (name == "number") prim("integer");
    return name;
  }

  std::string reserve(const std::string& hint) {
    std::string base;
    for (char c : hint) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      if (ok) base += c;
      else if (!base.empty() && base.back() != '-') base += '-';
      if (base.size() >= 48) break;
    }
    while (!base.empty() && base.back() == '-') base.pop_back();
    if (base.empty()) base = "rule";
    // The GBNF parser names the rules it generates "parent-N": keep "-digits" endings for it.
    const size_t dash = base.rfind('-');
    if (dash != std::string::npos && base.find_first_not_of("0123456789", dash + 1) == std::string::npos) base[dash] = '_';
    std::string name = base;
    for (int i = 2; names_.count(name); ++i) name = base + "_" + std::to_string(i);
    names_.insert(name);
    return name;
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    const std::string name = reserve(hint);
    rules_.emplace_back(name, body);
    return name;
  }

  // A rule name for an expression (kept as is when it already is one).
  std::string as_rule(const std::string& expr, const std::string& hint) {
    if (expr.find_first_of(" ()|\"[*+?{") == std::string::npos) return expr;
    return add_rule(hint, expr);
  }

  const Json& resolve(const std::string& ref, const std::string& ptr, std::string* target_ptr) {
    if (ref.empty() || ref[0] != '#')
      throw Error("json_schema: unsupported $ref '" + ref + "' at " + at(ptr) + " (only '#...' within the schema)");
    const std::string path = ref.substr(1);
    if (!path.empty() && path[0] != '/')
      throw Error("json_schema: unsupported $ref '" + ref + "' at " + at(ptr) + " (anchors are not resolved)");
    const Json* node = find_json_pointer(root_, path);
    if (node == nullptr) throw Error("json_schema: cannot resolve $ref '" + ref + "' at " + at(ptr));
    if (target_ptr) *target_ptr = path;
    return *node;
  }

  std::string ref_rule(const std::string& ref, const std::string& ptr) {
    if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
    std::string target_ptr;
    const Json& target = resolve(ref, ptr, &target_ptr);
    const size_t slash = target_ptr.rfind('/');
    const std::string name = reserve(ref == "#" ? "root-ref" : target_ptr.substr(slash + 1));
    ref_rules_[ref] = name;  // before visiting: recursive schemas refer to the rule being defined
    const std::string body = visit(target, target_ptr, name);
    rules_.emplace_back(name, body);
    return name;
  }

  void check_keywords(const Json& s, const std::string& ptr) {
    for (const auto& [k, v] : s.items()) {
      if (kRefused.count(k)) refuse_keyword(k, ptr);
      if (options_.refuse_unknown_keywords && !kHandled.count(k) && !kAnnotations.count(k) && k.rfind("x-", 0) != 0)
        throw Error("json_schema: unknown keyword '" + k + "' at " + at(ptr));
    }
  }

  // Follows $ref at the top of a schema used inside allOf/anyOf merging.
  const Json& deref(const Json& s, const std::string& ptr) {
    const Json* cur = &s;
    for (int i = 0; i < 32 && cur->is_object() && cur->contains("$ref") && only_annotations(*cur, {"$ref"}); ++i) {
      if (!cur->at("$ref").is_string()) bad_value("$ref", ptr, "must be a string");
      cur = &resolve(cur->at("$ref").get<std::string>(), ptr, nullptr);
    }
    return *cur;
  }

  static std::vector<std::string> type_list(const Json& t, const std::string& ptr) {
    std::vector<std::string> out;
    auto add = [&](const Json& v) {
      if (!v.is_string()) bad_value("type", ptr, "must be a string or an array of strings");
      const std::string name = v.get<std::string>();
      bool known = false;
      for (const char* k : kTypes) known = known || name == k;
      if (!known) bad_value("type", ptr, "names unknown type '" + name + "'");
      out.push_back(name);
    };
    if (t.is_array()) for (const auto& v : t) add(v);
    else add(t);
    return out;
  }

  // allOf semantics for two schemas, where it is a plain combination of their keywords.
  Json merge(const Json& a_in, const Json& b_in, const std::string& ptr) {
    if (++merge_depth_ > 64) throw Error("json_schema: $ref/allOf nesting too deep at " + at(ptr));
    struct Guard { int& d; ~Guard() { --d; } } guard{merge_depth_};
    const Json& a = deref(a_in, ptr);
    const Json& b = deref(b_in, ptr);
    if (a.is_boolean() || b.is_boolean()) {
      if ((a.is_boolean() && !a.get<bool>()) || (b.is_boolean() && !b.get<bool>()))
        throw Unsatisfiable("json_schema: false schema in allOf at " + at(ptr));
      return a.is_boolean() ? b : a;
    }
    if (!a.is_object() || !b.is_object()) throw Error("json_schema: schema at " + at(ptr) + " is not an object");
    Json out = a;
    // additionalProperties of one side also limits the properties the other side lists.
    for (const auto* side : {&a, &b}) {
      const Json& other = side == &a ? b : a;
      if (side->contains("additionalProperties") && !(side->at("additionalProperties") == true) && other.contains("properties"))
        for (const auto& [name, _] : other.at("properties").items())
          if (!side->contains("properties") || !side->at("properties").contains(name))
            throw Error("json_schema: cannot merge 'additionalProperties' with other 'properties' in allOf at " + at(ptr));
    }
    for (const auto& [k, v] : b.items()) {
      if (!out.contains(k)) { out[k] = v; continue; }
      Json& cur = out[k];
      if (cur == v || is_annotation(k)) continue;
      if (k == "type") {
        std::vector<std::string> ta = type_list(cur, ptr), tb = type_list(v, ptr), both;
        for (const auto& x : ta)
          for (const auto& y : tb)
            if (x == y || (x == "number" && y == "integer")) both.push_back(y);
            else if (x == "integer" && y == "number") both.push_back(x);
        if (both.empty()) throw Unsatisfiable("json_schema: types do not intersect in allOf at " + at(ptr));
        cur = Json(both);
      } else if (k == "required") {
        for (const auto& r : v) if (std::find(cur.begin(), cur.end(), r) == cur.end()) cur.push_back(r);
      } else if (k == "properties") {
        for (const auto& [name, sub] : v.items())
          cur[name] = cur.contains(name) ? Json{{"allOf", Json::array({cur[name], sub})}} : sub;
      } else if (k == "enum" || k == "const") {
        Json left = k == "enum" ? cur : Json::array({cur}), right = k == "enum" ? v : Json::array({v}), both = Json::array();
        for (const auto& x : left) if (std::find(right.begin(), right.end(), x) != right.end()) both.push_back(x);
        if (both.empty()) throw Unsatisfiable("json_schema: enum values do not intersect in allOf at " + at(ptr));
        if (k == "const") cur = both[0]; else cur = both;
      } else if ((k == "minimum" || k == "minLength" || k == "minItems" || k == "minProperties") && cur.is_number() && v.is_number()) {
        if (v > cur) cur = v;
      } else if ((k == "maximum" || k == "maxLength" || k == "maxItems" || k == "maxProperties") && cur.is_number() && v.is_number()) {
        if (v < cur) cur = v;
      } else if (k == "items" && cur.is_object() && v.is_object()) {
        cur = Json{{"allOf", Json::array({cur, v})}};
      } else {
        throw Error("json_schema: cannot merge keyword '" + k + "' in allOf at " + at(ptr));
      }
    }
    return out;
  }

  std::string visit(const Json& s, const std::string& ptr, const std::string& hint) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return prim("value");
      throw Unsatisfiable("json_schema: schema false at " + at(ptr) + " accepts no value");
    }
    if (!s.is_object()) throw Error("json_schema: schema at " + at(ptr) + " is not an object or a boolean");
    check_keywords(s, ptr);
    if (s.contains("$ref")) {
      if (!s.at("$ref").is_string()) bad_value("$ref", ptr, "must be a string");
      const std::string ref = s.at("$ref").get<std::string>();
      if (only_annotations(s, {"$ref"})) return ref_rule(ref, ptr);
      Json rest = s;
      rest.erase("$ref");
      return visit(merge(rest, resolve(ref, ptr, nullptr), ptr), ptr, hint);
    }
    if (s.contains("allOf")) {
      const Json& all = s.at("allOf");
      if (!all.is_array() || all.empty()) bad_value("allOf", ptr, "must be a non-empty array");
      Json merged = s;
      merged.erase("allOf");
      for (size_t i = 0; i < all.size(); ++i) merged = merge(merged, all[i], ptr + "/allOf/" + std::to_string(i));
      return visit(merged, ptr, hint);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      // oneOf is generated as anyOf: "exactly one branch matches" is not expressible in a grammar.
      if (s.contains("anyOf") && s.contains("oneOf")) refuse_keyword("oneOf", ptr);
      const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
      const Json& branches = s.at(key);
      if (!branches.is_array() || branches.empty()) bad_value(key, ptr, "must be a non-empty array");
      Json base = s;
      base.erase(key);
      const bool plain = only_annotations(base, {});
      std::vector<std::string> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        const std::string bptr = ptr + "/" + key + "/" + std::to_string(i);
        try {
          std::string e = plain ? visit(branches[i], bptr, hint + "-" + std::to_string(i))
                                : visit(merge(base, branches[i], bptr), bptr, hint + "-" + std::to_string(i));
          if (std::find(alts.begin(), alts.end(), e) == alts.end()) alts.push_back(e);
        } catch (const Unsatisfiable&) {
          // this branch accepts nothing; the others still do
        }
      }
      if (alts.empty()) throw Unsatisfiable("json_schema: no branch of '" + key + "' at " + at(ptr) + " is satisfiable");
      return list_text(alts);
    }
    if (s.contains("const") || s.contains("enum")) return visit_enum(s, ptr);

    std::vector<std::string> types;
    if (s.contains("type")) {
      types = type_list(s.at("type"), ptr);
    } else {
      // No type: keywords apply only to their own type. Generating just the types they describe is a
      // valid subset; with none of them, any value.
      auto has_any = [&](const auto& keys) {
        for (const auto& k : keys) if (s.contains(k)) return true;
        return false;
      };
      if (has_any(kObjectKeywords)) types.push_back("object");
      if (has_any(kArrayKeywords)) types.push_back("array");
      if (has_any(kStringKeywords)) types.push_back("string");
      if (has_any(kNumberKeywords)) types.push_back("number");
      if (types.empty()) return prim("value");
    }
    if (s.contains("nullable")) {
      if (!s.at("nullable").is_boolean()) bad_value("nullable", ptr, "must be a boolean");
      if (s.at("nullable").get<bool>()) types.push_back("null");
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    std::vector<std::string> alts;
    for (const auto& t : types) {
      std::string e;
      if (t == "null") e = prim("null");
      else if (t == "boolean") e = prim("boolean");
      else if (t == "string") e = visit_string(s, ptr, hint);
      else if (t == "integer") { if (has_number) continue; e = visit_number(s, ptr, true); }
      else if (t == "number") e = visit_number(s, ptr, false);
      else if (t == "object") e = visit_object(s, ptr, hint);
      else if (t == "array") e = visit_array(s, ptr, hint);
      if (!e.empty() && std::find(alts.begin(), alts.end(), e) == alts.end()) alts.push_back(e);
    }
    if (alts.empty()) throw Unsatisfiable("json_schema: schema at " + at(ptr) + " accepts no value");
    return list_text(alts);
  }

  // enum/const: the listed values that also meet the type and the bounds beside them.
  std::string visit_enum(const Json& s, const std::string& ptr) {
    Json values = Json::array();
    if (s.contains("const")) values.push_back(s.at("const"));
    if (s.contains("enum")) {
      if (!s.at("enum").is_array()) bad_value("enum", ptr, "must be an array");
      Json kept = Json::array();
      for (const auto& v : s.at("enum"))
        if (!s.contains("const") || v == s.at("const")) kept.push_back(v);
      values = kept;
    }
    std::vector<std::string> types;
    if (s.contains("type")) types = type_list(s.at("type"), ptr);
    if (s.value("nullable", false)) types.push_back("null");
    std::vector<std::string> alts;
    for (const auto& v : values) {
      if (!types.empty()) {
        bool ok = false;
        for (const auto& t : types)
          ok = ok || (t == "null" && v.is_null()) || (t == "boolean" && v.is_boolean()) ||
               (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
               (t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
               (t == "integer" && v.is_number() && std::floor(v.get<double>()) == v.get<double>());
        if (!ok) continue;
      }
      if (!enum_value_fits(v, s, ptr)) continue;
      const std::string lit = gbnf_literal_utf8(v.dump());
      if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(lit);
    }
    if (alts.empty()) throw Unsatisfiable("json_schema: no value of 'enum'/'const' at " + at(ptr) + " is valid");
    return list_text(alts);
  }

  bool enum_value_fits(const Json& v, const Json& s, const std::string& ptr) {
    for (const auto& [k, kv] : s.items()) {
      if (is_annotation(k) || k == "type" || k == "enum" || k == "const" || k == "nullable") continue;
      const bool applies = (kStringKeywords.count(k) && v.is_string()) || (kNumberKeywords.count(k) && v.is_number()) ||
                           (kObjectKeywords.count(k) && v.is_object()) || (kArrayKeywords.count(k) && v.is_array());
      if (!applies) continue;
      if (k == "minLength" || k == "maxLength") {
        const auto n = count_value(s, k.c_str(), ptr);
        const size_t len = code_points(v.get<std::string>());
        if (k == "minLength" ? len < *n : len > *n) return false;
      } else if ((k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") && kv.is_number()) {
        const double x = v.get<double>(), b = kv.get<double>();
        if ((k == "minimum" && x < b) || (k == "maximum" && x > b) || (k == "exclusiveMinimum" && x <= b) ||
            (k == "exclusiveMaximum" && x >= b))
          return false;
      } else if (k == "pattern" && kv.is_string()) {
        // Checking a listed value needs a regex engine, not a grammar: std::regex speaks ECMAScript too.
        try {
          if (!std::regex_search(v.get<std::string>(), std::regex(kv.get<std::string>(), std::regex::ECMAScript)))
            return false;
        } catch (const std::regex_error&) {
          throw Error("json_schema: 'pattern' beside 'enum' at " + at(ptr) + " is not a regular expression this converter reads");
        }
      } else if (k == "minItems" || k == "maxItems") {
        const auto n = count_value(s, k.c_str(), ptr);
        if (k == "minItems" ? v.size() < *n : v.size() > *n) return false;
      } else {
        throw Error("json_schema: unsupported keyword '" + k + "' beside 'enum' at " + at(ptr));
      }
    }
    return true;
  }

  std::string visit_string(const Json& s, const std::string& ptr, const std::string& hint) {
    const auto min_len = count_value(s, "minLength", ptr);
    const auto max_len = count_value(s, "maxLength", ptr);
    if (min_len && max_len && *min_len > *max_len)
      throw Unsatisfiable("json_schema: minLength > maxLength at " + at(ptr));
    const std::string quote = "\"\\\"\"";
    if (s.contains("pattern")) {
      if (!s.at("pattern").is_string()) bad_value("pattern", ptr, "must be a string");
      if (min_len || max_len) refuse_keyword(min_len ? "minLength" : "maxLength", ptr);  // with a pattern
      if (s.contains("format")) refuse_keyword("format", ptr);
      std::string body;
      try {
        body = regex_to_json_string_gbnf(s.at("pattern").get<std::string>(), prim("char"));
      } catch (const Error& e) {
        throw Error("json_schema: 'pattern' at " + at(ptr) + ": " + e.what());
      }
      return add_rule(hint + "-pattern", quote + (body.empty() ? "" : " " + body) + " " + quote);
    }
    if (s.contains("format")) {
      if (!s.at("format").is_string()) bad_value("format", ptr, "must be a string");
      const std::string format = s.at("format").get<std::string>();
      const auto body = string_format_gbnf(format);
      if (!body) throw Error("json_schema: unsupported format '" + format + "' at " + at(ptr));
      if (min_len || max_len) refuse_keyword(min_len ? "minLength" : "maxLength", ptr);  // with a format
      return add_rule(format + "-string", quote + " " + *body + " " + quote);
    }
    if (!min_len && !max_len) return prim("string");
    const uint64_t lo = min_len.value_or(0);
    std::string rep = max_len ? "{" + std::to_string(lo) + "," + std::to_string(*max_len) + "}"
                              : "{" + std::to_string(lo) + ",}";
    return add_rule(hint + "-string", quote + " " + prim("char") + rep + " " + quote);
  }

  // Integer bound from minimum/maximum/exclusive*; nullopt if absent. Draft-04 boolean exclusives too.
  std::optional<std::pair<BigInt, bool>> bound(const Json& s, bool lower, bool integer, const std::string& ptr) {
    const char* incl_key = lower ? "minimum" : "maximum";
    const char* excl_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<std::pair<double, bool>> b;  // value, exclusive
    if (s.contains(incl_key)) {
      if (!s.at(incl_key).is_number()) bad_value(incl_key, ptr, "must be a number");
      bool excl = false;
      if (s.contains(excl_key) && s.at(excl_key).is_boolean()) excl = s.at(excl_key).get<bool>();
      b = std::make_pair(s.at(incl_key).get<double>(), excl);
    }
    if (s.contains(excl_key) && !s.at(excl_key).is_boolean()) {
      if (!s.at(excl_key).is_number()) bad_value(excl_key, ptr, "must be a number or a boolean");
      const double v = s.at(excl_key).get<double>();
      if (!b || (lower ? v >= b->first : v <= b->first)) b = std::make_pair(v, true);
    }
    if (!b) return std::nullopt;
    const char* key = b->second && s.contains(excl_key) && !s.at(excl_key).is_boolean() ? excl_key : incl_key;
    double v = b->first;
    if (!std::isfinite(v) || std::fabs(v) >= 1e36) bad_value(key, ptr, "is out of the supported range");
    if (integer) {
      // The nearest integer inside the bound, inclusive.
      double r = lower ? (b->second ? std::floor(v) + 1 : std::ceil(v)) : (b->second ? std::ceil(v) - 1 : std::floor(v));
      return std::make_pair(static_cast<BigInt>(r), false);
    }
    if (std::floor(v) != v) {
      throw Error("json_schema: unsupported keyword '" + std::string(key) + "' at " + at(ptr) +
                  " (only integer bounds for numbers)");
    }
    return std::make_pair(static_cast<BigInt>(v), b->second);
  }

  std::string visit_number(const Json& s, const std::string& ptr, bool integer) {
    if (s.contains("multipleOf")) {
      const Json& m = s.at("multipleOf");
      if (!m.is_number() || m.get<double>() <= 0) bad_value("multipleOf", ptr, "must be a positive number");
      // multipleOf 1 makes a number an integer; anything else is not generated.
      if (m.get<double>() != 1) refuse_keyword("multipleOf", ptr);
      integer = true;
    }
    const auto lo = bound(s, true, integer, ptr);
    const auto hi = bound(s, false, integer, ptr);
    if (!lo && !hi) return prim(integer ? "integer" : "number");
    std::optional<BigInt> lo_v, hi_v;
    if (lo) lo_v = lo->first;
    if (hi) hi_v = hi->first;
    std::string body;
    if (integer) {
      if (lo_v && hi_v && *lo_v > *hi_v) throw Unsatisfiable("json_schema: empty integer range at " + at(ptr));
      body = integer_range_gbnf(lo_v, hi_v);
    } else {
      body = decimal_range_gbnf(lo_v, lo && lo->second, hi_v, hi && hi->second);
      if (body.empty()) throw Unsatisfiable("json_schema: empty number range at " + at(ptr));
    }
    std::string name = std::string(integer ? "integer" : "number") + "-" + (lo_v ? to_decimal(*lo_v) : "inf") + "-" +
                       (hi_v ? to_decimal(*hi_v) : "inf");
    for (auto& [n, b] : rules_) if (b == body) return n;  // the same range is common; one rule serves all
    return add_rule(name, body);
  }

  std::string visit_object(const Json& s, const std::string& ptr, const std::string& hint);
  std::string visit_array(const Json& s, const std::string& ptr, const std::string& hint);
  std::string key_not_in(const std::vector<std::u32string>& names);
};

std::string Converter::visit_object(const Json& s, const std::string& ptr, const std::string& hint) {
  struct Member {
    std::string name;
    bool required;
    std::string kv;  // rule name
  };
  std::vector<Member> members;
  std::vector<std::string> required;
  if (s.contains("required")) {
    const Json& r = s.at("required");
    if (!r.is_array()) bad_value("required", ptr, "must be an array of strings");
    for (const auto& v : r) {
      if (!v.is_string()) bad_value("required", ptr, "must be an array of strings");
      required.push_back(v.get<std::string>());
    }
  }
  auto is_required = [&](const std::string& n) { return std::find(required.begin(), required.end(), n) != required.end(); };
  const Json empty_props = Json::object();
  const Json& props = s.contains("properties") ? s.at("properties") : empty_props;
  if (!props.is_object()) bad_value("properties", ptr, "must be an object");
  std::vector<std::pair<std::string, const Json*>> patterns;
  if (s.contains("patternProperties")) {
    if (!s.at("patternProperties").is_object()) bad_value("patternProperties", ptr, "must be an object");
    for (const auto& [p, sub] : s.at("patternProperties").items()) patterns.emplace_back(p, &sub);
  }
  auto matches = [&](const std::string& pattern, const std::string& name) {
    try {
      return std::regex_search(name, std::regex(pattern, std::regex::ECMAScript));
    } catch (const std::regex_error&) {
      throw Error("json_schema: 'patternProperties' at " + at(ptr) + ": '" + pattern + "' is not a regular expression this converter reads");
    }
  };
  auto add_member = [&](const std::string& name, const Json& sub_in, const std::string& sub_ptr) {
    const std::string key = gbnf_literal_utf8(Json(name).dump() + ":");
    // A listed property whose name a pattern matches must satisfy that pattern's schema as well.
    Json all = Json::array({sub_in});
    for (const auto& [p, ps] : patterns) if (matches(p, name)) all.push_back(*ps);
    const Json sub = all.size() == 1 ? sub_in : Json{{"allOf", all}};
    std::string value;
    try {
      value = visit(sub, sub_ptr, hint + "-" + name);
    } catch (const Unsatisfiable&) {
      if (is_required(name)) throw;
      return;  // an optional property no value satisfies is simply never written
    }
    members.push_back({name, is_required(name), add_rule(hint + "-" + name + "-kv", key + " " + value)});
  };
  for (const auto& [name, sub] : props.items()) add_member(name, sub, ptr + "/properties/" + pointer_token(name));
  // Required names the schema does not describe take any value.
  for (const auto& name : required)
    if (!props.contains(name)) add_member(name, Json(true), ptr + "/required");

  // Extra members (see the header for the default). Their values satisfy every pattern schema that
  // may also match their key, so an overlap between patterns or with additionalProperties stays valid.
  std::vector<std::string> extra_alts;
  for (size_t j = 0; j < patterns.size(); ++j) {
    const auto& [pattern, sub] = patterns[j];
    const std::string pptr = ptr + "/patternProperties/" + pointer_token(pattern);
    for (const auto& m : members)
      if (matches(pattern, m.name))
        throw Error("json_schema: unsupported keyword 'patternProperties' at " + at(ptr) + " (pattern '" + pattern +
                    "' also matches the listed property '" + m.name + "')");
    Json all = Json::array({*sub});
    for (size_t i = 0; i < patterns.size(); ++i)
      if (i != j && !disjoint_patterns(patterns[i].first, pattern)) all.push_back(*patterns[i].second);
    std::string key, value;
    try {
      key = regex_to_json_string_gbnf(pattern, prim("char"));
    } catch (const Error& e) {
      throw Error("json_schema: 'patternProperties' at " + at(ptr) + ": " + e.what());
    }
    try {
      value = visit(all.size() == 1 ? *sub : Json{{"allOf", all}}, pptr, hint + "-pattern");
    } catch (const Unsatisfiable&) {
      continue;
    }
    extra_alts.push_back(add_rule(hint + "-pattern-kv", "\"\\\"\" " + key + " \"\\\":\" " + value));
  }
  std::optional<Json> additional;
  if (s.contains("additionalProperties")) {
    const Json& ap = s.at("additionalProperties");
    if (!(ap.is_boolean() || ap.is_object())) bad_value("additionalProperties", ptr, "must be a boolean or a schema");
    if (!(ap.is_boolean() && !ap.get<bool>())) additional = ap;
  } else if (props.empty() && patterns.empty()) {
    additional = Json(true);
  }
  if (additional) {
    Json all = Json::array({*additional});
    for (const auto& [p, ps] : patterns) all.push_back(*ps);
    try {
      const std::string value = visit(all.size() == 1 ? *additional : Json{{"allOf", all}},
                                      ptr + "/additionalProperties", hint + "-additional");
      std::vector<std::u32string> names;
      for (const auto& m : members) names.push_back(decode_utf8(m.name, "json_schema: property name"));
      extra_alts.push_back(add_rule(hint + "-additional-kv", "\"\\\"\" " + key_not_in(names) + " \"\\\":\" " + value));
    } catch (const Unsatisfiable&) {
    }
  }
  const bool has_extra = !extra_alts.empty();
  size_t n_required = 0;
  for (const auto& m : members) n_required += m.required;
  const auto min_props = count_value(s, "minProperties", ptr);
  const auto max_props = count_value(s, "maxProperties", ptr);
  if (min_props && *min_props > n_required) refuse_keyword("minProperties", ptr);
  if (max_props && (has_extra || members.size() > *max_props)) {
    if (*max_props < n_required) throw Unsatisfiable("json_schema: maxProperties below the required count at " + at(ptr));
    refuse_keyword("maxProperties", ptr);
  }

  const std::string extra = has_extra ? as_rule(list_text(extra_alts), hint + "-extra-kv") : "";
  // tail[i]: members i.. after something has been written, each after a comma.
  std::vector<std::string> tail(members.size() + 1);
  if (has_extra) tail[members.size()] = "(\",\" " + extra + ")*";
  for (size_t i = members.size(); i-- > 1;) {  // tail[0] is never used: the first member has no comma
    std::string piece = "\",\" " + members[i].kv;
    if (!members[i].required) piece = "(" + piece + ")?";
    std::string body = tail[i + 1].empty() ? piece : piece + " " + tail[i + 1];
    // Share long tails through rules so the text stays linear in the member count.
    tail[i] = i + 1 < members.size() ? add_rule(hint + "-tail", body) : body;
  }
  // The first member written: any optional one up to the first required one (which cannot be skipped).
  std::vector<std::string> firsts;
  bool all_optional = true;
  for (size_t i = 0; i < members.size(); ++i) {
    firsts.push_back(members[i].kv + (tail[i + 1].empty() ? "" : " " + tail[i + 1]));
    if (members[i].required) { all_optional = false; break; }
  }
  if (all_optional && has_extra) firsts.push_back(extra + " " + tail[members.size()]);
  std::string inner = list_text(firsts);
  if (inner.empty()) return add_rule(hint + "-object", "\"{}\"");
  if (all_optional) inner = "(" + inner + ")?";
  return add_rule(hint + "-object", "\"{\" " + inner + " \"}\"");
}

std::string Converter::visit_array(const Json& s, const std::string& ptr, const std::string& hint) {
  if (s.contains("uniqueItems")) {
    const Json& u = s.at("uniqueItems");
    if (!u.is_boolean()) bad_value("uniqueItems", ptr, "must be a boolean");
    const auto max_items = count_value(s, "maxItems", ptr);
    if (u.get<bool>() && !(max_items && *max_items <= 1)) refuse_keyword("uniqueItems", ptr);
  }
  std::vector<std::string> prefix;
  std::optional<std::string> rest;  // nullopt: no items past the prefix
  auto item = [&](const Json& sub, const std::string& sub_ptr, const std::string& h) -> std::optional<std::string> {
    try {
      return as_rule(visit(sub, sub_ptr, h), h);
    } catch (const Unsatisfiable&) {
      return std::nullopt;
    }
  };
  const Json* rest_schema = nullptr;
  std::string rest_ptr;
  const Json any = true;
  if (s.contains("prefixItems") || (s.contains("items") && s.at("items").is_array())) {
    const bool modern = s.contains("prefixItems");
    const Json& list = s.at(modern ? "prefixItems" : "items");
    if (!list.is_array()) bad_value("prefixItems", ptr, "must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto e = item(list[i], ptr + (modern ? "/prefixItems/" : "/items/") + std::to_string(i), hint + "-item" + std::to_string(i));
      if (!e) break;  // no value fits here: the array ends before it
      prefix.push_back(*e);
    }
    const char* rest_key = modern ? "items" : "additionalItems";
    rest_schema = s.contains(rest_key) ? &s.at(rest_key) : &any;
    rest_ptr = ptr + "/" + rest_key;
    if (prefix.size() < list.size()) rest_schema = nullptr;
  } else {
    rest_schema = s.contains("items") ? &s.at("items") : &any;
    rest_ptr = ptr + "/items";
  }
  if (rest_schema) rest = item(*rest_schema, rest_ptr, hint + "-item");
  const uint64_t min_items = count_value(s, "minItems", ptr).value_or(0);
  std::optional<uint64_t> max_items = count_value(s, "maxItems", ptr);
  if (!rest) max_items = std::min<uint64_t>(max_items.value_or(prefix.size()), prefix.size());
  if (max_items && min_items > *max_items) throw Unsatisfiable("json_schema: minItems above what maxItems/items allow at " + at(ptr));
  const size_t k = prefix.size();
  // Items k.. from the rest schema, count in [max(0, min-k), max-k].
  auto rest_part = [&](bool first) -> std::string {
    if (!rest || (max_items && *max_items <= k)) return "";
    const uint64_t lo = min_items > k ? min_items - k : 0;
    const std::optional<uint64_t> hi = max_items ? std::optional<uint64_t>(*max_items - k) : std::nullopt;
    auto rep = [](uint64_t a, std::optional<uint64_t> b) -> std::string {
      if (b && *b == 0) return "";
      if (a == 0 && !b) return "*";
      if (a == 1 && !b) return "+";
      if (a == 0 && b && *b == 1) return "?";
      if (b && a == *b) return "{" + std::to_string(a) + "}";
      return "{" + std::to_string(a) + "," + (b ? std::to_string(*b) : "") + "}";
    };
    const std::string more = "(\",\" " + *rest + ")";
    if (!first) {
      const std::string r = rep(lo, hi);
      return r.empty() ? "" : more + r;
    }
    const std::string tail_rep = rep(lo > 0 ? lo - 1 : 0, hi ? std::optional<uint64_t>(*hi - 1) : std::nullopt);
    const std::string list = *rest + (tail_rep.empty() ? "" : " " + more + tail_rep);
    return lo == 0 ? "(" + list + ")?" : list;
  };
  std::string body = rest_part(k == 0);
  for (size_t i = k; i-- > 0;) {
    std::string piece = (i == 0 ? "" : "\",\" ") + prefix[i] + (body.empty() ? "" : " " + body);
    body = i >= min_items ? "(" + piece + ")?" : piece;
  }
  return add_rule(hint + "-array", "\"[\"" + (body.empty() ? "" : " " + body) + " \"]\"");
}

// Key text (between the quotes, written with key-char) that decodes to none of `names`: a trie of the
// names where each node may end (unless a name ends there), leave the trie by a character no name
// continues with, or follow a name.
std::string Converter::key_not_in(const std::vector<std::u32string>& names) {
  prim("key-char");
  struct TrieNode {
    std::map<char32_t, TrieNode> next;
    bool end = false;
  };
  TrieNode root;
  for (const auto& n : names) {
    bool spellable = true;
    for (char32_t c : n) spellable = spellable && c >= 0x20;
    if (!spellable) continue;  // key-char cannot write it, so no key can collide with it
    TrieNode* node = &root;
    for (char32_t c : n) node = &node->next[c];
    node->end = true;
  }
  std::function<std::string(const TrieNode&)> emit = [&](const TrieNode& node) -> std::string {
    if (node.next.empty()) return node.end ? "key-char+" : "key-char*";
    std::vector<std::string> alts;
    CodeRanges used = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    for (const auto& [c, _] : node.next) used.emplace_back(c, c);
    normalize_ranges(used);
    CodeRanges other = complement_ranges(used);
    std::string leave = gbnf_class(other);
    if (!node.next.count('"')) leave = "(" + leave + " | \"\\\\\\\"\")";
    if (!node.next.count('\\')) leave = "(" + leave + " | \"\\\\\\\\\")";
    alts.push_back(leave + " key-char*");
    for (const auto& [c, child] : node.next) {
      std::u32string lit = c == '"' ? U"\\\"" : c == '\\' ? U"\\\\" : std::u32string(1, c);
      alts.push_back(gbnf_literal(lit) + " " + emit(child));
    }
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + (node.end ? ")" : ")?");
  };
  return add_rule("key", emit(root));
}

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return Converter(schema, options).run();
}

std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()), options);
}

std::string json_schema_text_to_gbnf(std::string_view schema_text, const JsonSchemaOptions& options) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(std::string("json_schema: the schema is not valid JSON: ") + e.what());
  }
  return json_schema_to_gbnf(schema, options);
}

std::string json_object_gbnf() { return json_schema_to_gbnf(nlohmann::ordered_json{{"type", "object"}}); }

}  // namespace tessera::grammar
