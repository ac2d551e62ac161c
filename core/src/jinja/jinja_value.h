// The values a Jinja template computes with, modelled on the Python objects Jinja2 uses so that
// printing, comparing and serialising give Python's bytes: str() of a float is repr(), dicts keep
// insertion order, lists are shared by reference (a namespace or list mutated through one name is
// seen through every other), and Undefined is Jinja2's default Undefined (prints as "", is falsy,
// iterates as empty, fails on attribute access or arithmetic).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::jinja {

// Raised while rendering; the renderer adds the template name and line.
struct RenderFailure {
  std::string message;
};
[[noreturn]] void fail(const std::string& message);

enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, callable };

struct Value;
struct Dict;
struct Callable;
using List = std::vector<Value>;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The keyword `name`, or positional `index` when not given by name; nullptr when neither.
  const Value* get(size_t index, std::string_view name) const;
};

struct Value {
  Kind kind = Kind::undefined;
  bool markup = false;  // string: markupsafe.Markup (|safe, |escape): `+` escapes a plain operand
  bool tuple = false;   // list: a Python tuple (repr with parentheses)
  // list: what Jinja2 would hold instead of a list: "generator" (map, select... results: always
  // true, no len, not JSON), "list_reverseiterator", or a dict view "dict_items" (no index, not JSON)
  const char* view = nullptr;
  bool flag = false;    // boolean value
  int64_t i = 0;
  double f = 0;
  std::string s;  // string: its UTF-8 text; undefined: the error its misuse reports
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  Value() = default;
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v, bool markup = false);
  static Value make_list(List items = {}, bool tuple = false);
  static Value make_view(List items, const char* view);  // "generator", "dict_items"...
  bool is_iterator() const;  // a generator or reverse iterator (dict views are not)
  static Value make_dict();
  static Value make_namespace();
  static Value function(std::string name, std::function<Value(CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_list() const { return kind == Kind::list; }
  bool is_dict() const { return kind == Kind::dict; }
  bool is_namespace() const;
  bool is_callable() const { return kind == Kind::callable; }

  bool truthy() const;
  double as_double() const;  // numbers (bool as 0/1); fails otherwise
  int64_t as_int() const;    // integers and bools; fails otherwise
  // Python str(): what {{ value }} prints.
  std::string str() const;
  // Python repr().
  std::string repr() const;
  // "'dict object'"-style type name for error messages.
  std::string type_name() const;
  [[noreturn]] void fail_undefined() const;
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;
  Value* find(const Value& key);
  Value* find(std::string_view key);
  void set(const Value& key, Value value);
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <, failing (as TypeError does) for unorderable types; `fold` compares strings lowercased.
int compare(const Value& a, const Value& b, bool fold = false);
// Python `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
// The items a for loop visits: list items, dict keys, string characters; undefined gives none.
List iterate(const Value& v);
// len().
int64_t length(const Value& v);

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter calls it.
struct JsonStyle {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonStyle& style);

// Python float.__repr__.
std::string float_repr(double d);
// markupsafe.escape.
std::string html_escape(std::string_view s);

// UTF-8 helpers: strings index, slice and measure in code points as Python's str does.
std::vector<uint32_t> decode_utf8(std::string_view s);
std::string encode_utf8(const std::vector<uint32_t>& cps);
void append_utf8(std::string& out, uint32_t cp);
size_t utf8_length(std::string_view s);
bool is_py_space(uint32_t cp);  // str.isspace()
// str.strip / lstrip / rstrip: `chars` null means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);

}  // namespace tessera::jinja
