#include "jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tessera::jinja {

void fail(const std::string& message) { throw RenderFailure{message}; }

const Value* CallArgs::get(size_t index, std::string_view name) const {
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return index < pos.size() ? &pos[index] : nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::boolean;
  v.flag = b;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::integer;
  v.i = x;
  return v;
}
Value Value::floating(double x) {
  Value v;
  v.kind = Kind::floating;
  v.f = x;
  return v;
}
Value Value::string(std::string x, bool markup) {
  Value v;
  v.kind = Kind::string;
  v.s = std::move(x);
  v.markup = markup;
  return v;
}
Value Value::make_list(List items, bool tuple) {
  Value v;
  v.kind = Kind::list;
  v.tuple = tuple;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_view(List items, const char* view) {
  Value v = make_list(std::move(items));
  v.view = view;
  return v;
}

bool Value::is_iterator() const {
  return kind == Kind::list && view != nullptr && view[0] != 'd';
}

Value Value::make_dict() {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_namespace() {
  Value v = make_dict();
  v.dict->is_namespace = true;
  return v;
}
Value Value::function(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind = Kind::callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = make_dict();
      for (const auto& [k, e] : j.items()) d.dict->items.emplace_back(string(k), from_json(e));
      return d;
    }
    default: return undefined("a JSON value of an unsupported type");
  }
}

bool Value::is_namespace() const { return kind == Kind::dict && dict->is_namespace; }

bool Value::truthy() const {
  switch (kind) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return flag;
    case Kind::integer: return i != 0;
    case Kind::floating: return f != 0;
    case Kind::string: return !s.empty();
    case Kind::list: return is_iterator() || !list->empty();
    case Kind::dict: return dict->is_namespace || !dict->items.empty();
    case Kind::callable: return true;
  }
  return false;
}

double Value::as_double() const {
  if (kind == Kind::integer) return static_cast<double>(i);
  if (kind == Kind::floating) return f;
  if (kind == Kind::boolean) return flag ? 1 : 0;
  if (kind == Kind::undefined) fail_undefined();
  fail("expected a number, got " + type_name());
}

int64_t Value::as_int() const {
  if (kind == Kind::integer) return i;
  if (kind == Kind::boolean) return flag ? 1 : 0;
  if (kind == Kind::undefined) fail_undefined();
  fail("expected an integer, got " + type_name());
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "None";
    case Kind::boolean: return "'bool object'";
    case Kind::integer: return "'int object'";
    case Kind::floating: return "'float object'";
    case Kind::string: return "'str object'";
    case Kind::list: return view != nullptr ? std::string("'") + view + " object'" : tuple ? "'tuple object'" : "'list object'";
    case Kind::dict: return dict->is_namespace ? "'Namespace object'" : "'dict object'";
    case Kind::callable: return "'function object'";
  }
  return "?";
}

void Value::fail_undefined() const { fail(s.empty() ? std::string("undefined value") : s); }

namespace {

bool printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  if (cp <= 0xa0 || cp == 0xad || cp == 0x1680 || cp == 0x3000 || cp == 0xfeff) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f)) return false;
  if ((cp >= 0xd800 && cp <= 0xf8ff) || (cp >= 0xfff9 && cp <= 0xfffb)) return false;
  return true;
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (uint32_t cp : decode_utf8(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (printable(cp)) {
      append_utf8(out, cp);
    } else {
      if (cp <= 0xff) {
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      } else if (cp <= 0xffff) {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      }
      out += buf;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (kind) {
    case Kind::undefined: return "";
    case Kind::string: return s;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "None";
    case Kind::boolean: return flag ? "True" : "False";
    case Kind::integer: return std::to_string(i);
    case Kind::floating: return float_repr(f);
    case Kind::string: return markup ? "Markup(" + string_repr(s) + ")" : string_repr(s);
    case Kind::list: {
      if (is_iterator()) return std::string("<") + view + " object>";
      std::string out = view != nullptr ? std::string(view) + "([" : tuple ? "(" : "[";
      for (size_t k = 0; k < list->size(); ++k) {
        if (k > 0) out += ", ";
        out += (*list)[k].repr();
      }
      if (view != nullptr) return out + "])";
      if (tuple && list->size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Kind::dict: {
      std::string out = dict->is_namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < dict->items.size(); ++k) {
        if (k > 0) out += ", ";
        out += dict->items[k].first.repr() + ": " + dict->items[k].second.repr();
      }
      return out + (dict->is_namespace ? "}>" : "}");
    }
    case Kind::callable: return "<function " + fn->name + ">";
  }
  return "";
}

Value* Dict::find(const Value& key) {
  for (auto& [k, v] : items) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items) {
    if (k.kind == Kind::string && k.s == key) return &v;
  }
  return nullptr;
}

void Dict::set(const Value& key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
  } else {
    items.emplace_back(key, std::move(value));
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::floating && b.kind != Kind::floating) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string: return a.s == b.s;
    case Kind::list: {
      if (a.view != nullptr || b.view != nullptr) return a.list == b.list;
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Kind::dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::callable: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, bool fold) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::floating && b.kind != Kind::floating) {
      return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
    }
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = fold ? ascii_lower(a.s).compare(ascii_lower(b.s)) : a.s.compare(b.s);
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.tuple == b.tuple && a.view == nullptr && b.view == nullptr) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return compare((*a.list)[k], (*b.list)[k], fold);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  fail("'<' not supported between " + a.type_name() + " and " + b.type_name());
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind) {
    case Kind::undefined: return false;
    case Kind::string:
      if (!needle.is_string()) fail("'in <string>' requires string as left operand, not " + needle.type_name());
      return haystack.s.find(needle.s) != std::string::npos;
    case Kind::list:
      return std::any_of(haystack.list->begin(), haystack.list->end(), [&](const Value& v) { return equals(v, needle); });
    case Kind::dict: return haystack.dict->find(needle) != nullptr;
    default: fail("argument of type " + haystack.type_name() + " is not iterable");
  }
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return {};
    case Kind::list: return *v.list;
    case Kind::dict: {
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::string: {
      List chars;
      for (uint32_t cp : decode_utf8(v.s)) {
        std::string c;
        append_utf8(c, cp);
        chars.push_back(Value::string(std::move(c)));
      }
      return chars;
    }
    default: fail(v.type_name() + " is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return 0;
    case Kind::string: return static_cast<int64_t>(utf8_length(v.s));
    case Kind::list:
      if (v.is_iterator()) fail("object of type '" + std::string(v.view) + "' has no len()");
      return static_cast<int64_t>(v.list->size());
    case Kind::dict: return static_cast<int64_t>(v.dict->items.size());
    default: fail("object of type " + v.type_name() + " has no len()");
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (!mant.empty() && mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min(digits.size(), size_t(exp) + 1));
      while (int_part.size() < size_t(exp) + 1) int_part += '0';
      std::string frac = digits.size() > size_t(exp) + 1 ? digits.substr(size_t(exp) + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + out + ebuf;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (uint32_t cp : decode_utf8(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
          if (cp > 0xffff) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          append_utf8(out, cp);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind) {
    case Kind::string: return k.s;
    case Kind::integer: return std::to_string(k.i);
    case Kind::floating: return json_float(k.f);
    case Kind::boolean: return k.flag ? "true" : "false";
    case Kind::none: return "null";
    default: fail("keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

void dump(std::string& out, const Value& v, const JsonStyle& st, int level) {
  auto newline = [&](int lvl) {
    if (!st.has_indent) return;
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += st.indent;
  };
  switch (v.kind) {
    case Kind::none: out += "null"; return;
    case Kind::boolean: out += v.flag ? "true" : "false"; return;
    case Kind::integer: out += std::to_string(v.i); return;
    case Kind::floating: out += json_float(v.f); return;
    case Kind::string: json_string(out, v.s, st.ensure_ascii); return;
    case Kind::list: {
      if (v.view != nullptr) break;
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += st.item_sep;
        newline(level + 1);
        dump(out, (*v.list)[k], st, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::dict: {
      if (v.dict->is_namespace) break;
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, e] : v.dict->items) items.emplace_back(json_key(k), &e);
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) out += st.item_sep;
        newline(level + 1);
        json_string(out, items[k].first, st.ensure_ascii);
        out += st.key_sep;
        dump(out, *items[k].second, st, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  fail("Object of type " + v.type_name() + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  dump(out, v, style, 0);
  return out;
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    size_t n = 0;
    uint32_t cp = c;
    if (c < 0x80) {
      n = 0;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      out.push_back(c);  // a stray byte stands for itself
      ++k;
      continue;
    }
    bool ok = k + n < s.size();
    for (size_t j = 1; ok && j <= n; ++j) {
      const auto cc = static_cast<unsigned char>(s[k + j]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out.push_back(c);
      ++k;
      continue;
    }
    out.push_back(cp);
    k += n + 1;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string encode_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
  }
  return n;
}

bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<uint32_t> set;
  if (chars != nullptr) set = decode_utf8(*chars);
  auto strip_it = [&](uint32_t cp) {
    return chars == nullptr ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return encode_utf8(std::vector<uint32_t>(cps.begin() + long(b), cps.begin() + long(e)));
}

std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

std::string ascii_upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

}  // namespace tessera::jinja
