// Python semantics the templates lean on: the arithmetic operators and the methods of str, dict and
// list (`content.split('</think>')[-1]`, `param.get('type', 'any')`, `d.items()`...).
// list.append and friends are refused by transformers' immutable sandbox; they are accepted here,
// as llama.cpp accepts them, since templates written for other runtimes use them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "jinja_eval.h"

namespace tessera::jinja {

namespace {

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for " + op + ": " + a.type_name() + " and " + b.type_name());
}

bool is_int(const Value& v) { return v.kind == Kind::integer || v.kind == Kind::boolean; }

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(std::move(out), seq.markup);
  }
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out), seq.tuple);
}

std::string arg_string(const CallArgs& a, size_t i, const char* name, const char* method) {
  const Value* v = a.get(i, name);
  if (v == nullptr || !v->is_string()) fail(std::string("str.") + method + "() expects a string argument");
  return v->s;
}

// str.split / rsplit.
List split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  List out;
  if (sep == nullptr || sep->is_none()) {
    std::vector<uint32_t> cps = decode_utf8(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    std::vector<std::vector<uint32_t>> words;
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k == cps.size()) break;
      if (maxsplit >= 0 && int64_t(words.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > k && is_py_space(cps[e - 1])) --e;
        words.emplace_back(cps.begin() + long(k), cps.begin() + long(e));
        break;
      }
      size_t e = k;
      while (e < cps.size() && !is_py_space(cps[e])) ++e;
      words.emplace_back(cps.begin() + long(k), cps.begin() + long(e));
      k = e;
    }
    for (auto& w : words) {
      if (from_right) std::reverse(w.begin(), w.end());
      out.push_back(Value::string(encode_utf8(w)));
    }
    if (from_right) std::reverse(out.begin(), out.end());
    return out;
  }
  if (!sep->is_string()) fail("str.split() separator must be a string or None");
  if (sep->s.empty()) fail("str.split(): empty separator");
  const std::string& d = sep->s;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      const size_t p = s.find(d, start);
      if (p == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
      out.push_back(Value::string(s.substr(start, p - start)));
      start = p + d.size();
    }
    out.push_back(Value::string(s.substr(start)));
    return out;
  }
  size_t end = s.size();
  while (true) {
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) break;
    if (end < d.size()) break;
    const size_t p = s.rfind(d, end - d.size());
    if (p == std::string::npos) break;
    out.push_back(Value::string(s.substr(p + d.size(), end - p - d.size())));
    end = p;
  }
  out.push_back(Value::string(s.substr(0, end)));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool upper = c >= 'A' && c <= 'Z', lower = c >= 'a' && c <= 'z';
    if (upper || lower) {
      if (prev_cased && upper) c = static_cast<char>(c - 'A' + 'a');
      if (!prev_cased && lower) c = static_cast<char>(c - 'a' + 'A');
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

bool prefix_test(const std::string& s, const Value& arg, bool ends) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail(std::string(ends ? "endswith" : "startswith") + " first arg must be str or a tuple of str");
    if (p.s.size() > s.size()) return false;
    return ends ? s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0 : s.compare(0, p.s.size(), p.s) == 0;
  };
  if (arg.is_list()) return std::any_of(arg.list->begin(), arg.list->end(), one);
  return one(arg);
}

template <typename F>
bool all_chars(const std::string& s, F pred) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); });
}

std::optional<Value> string_method(const Value& obj, const std::string& name) {
  const std::string s = obj.s;
  const bool mk = obj.markup;
  auto fn = [&](auto body) { return Value::function("str." + name, body); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return fn([s, l, r, mk](CallArgs& a) {
      const Value* c = a.get(0, "chars");
      const std::string* chars = c != nullptr && c->is_string() ? &c->s : nullptr;
      return Value::string(py_strip(s, chars, l, r), mk);
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return fn([s, right](CallArgs& a) {
      const Value* m = a.get(1, "maxsplit");
      return Value::make_list(split(s, a.get(0, "sep"), m != nullptr ? m->as_int() : -1, right));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool ends = name == "endswith";
    return fn([s, ends](CallArgs& a) {
      const Value* p = a.get(0, "prefix");
      if (p == nullptr) fail("startswith/endswith takes an argument");
      return Value::boolean(prefix_test(s, *p, ends));
    });
  }
  if (name == "upper") return fn([s, mk](CallArgs&) { return Value::string(ascii_upper(s), mk); });
  if (name == "lower" || name == "casefold") return fn([s, mk](CallArgs&) { return Value::string(ascii_lower(s), mk); });
  if (name == "title") return fn([s, mk](CallArgs&) { return Value::string(py_title(s), mk); });
  if (name == "capitalize") {
    return fn([s, mk](CallArgs&) {
      std::string out = ascii_lower(s);
      if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
      return Value::string(out, mk);
    });
  }
  if (name == "replace") {
    return fn([s](CallArgs& a) {
      const std::string from = arg_string(a, 0, "old", "replace"), to = arg_string(a, 1, "new", "replace");
      const Value* c = a.get(2, "count");
      int64_t count = c != nullptr ? c->as_int() : -1;
      std::string out;
      if (from.empty()) {  // Python inserts `to` around every character
        const std::vector<uint32_t> cps = decode_utf8(s);
        for (size_t k = 0; k <= cps.size(); ++k) {
          if (count != 0) {
            out += to;
            --count;
          }
          if (k < cps.size()) append_utf8(out, cps[k]);
        }
        return Value::string(out);
      }
      size_t start = 0;
      while (count != 0) {
        const size_t p = s.find(from, start);
        if (p == std::string::npos) break;
        out += s.substr(start, p - start) + to;
        start = p + from.size();
        --count;
      }
      out += s.substr(start);
      return Value::string(out);
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return fn([s, name](CallArgs& a) {
      const std::string sub = arg_string(a, 0, "sub", name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      const size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") fail("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(int64_t(utf8_length(s.substr(0, p))));
    });
  }
  if (name == "join") {
    return fn([s](CallArgs& a) {
      const Value* it = a.get(0, "iterable");
      if (it == nullptr) fail("str.join() takes one argument");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(*it)) {
        if (!v.is_string()) fail("sequence item: expected str instance, " + v.type_name() + " found");
        if (!first) out += s;
        out += v.s;
        first = false;
      }
      return Value::string(out);
    });
  }
  if (name == "format") return fn([s](CallArgs& a) { return Value::string(brace_format(s, a)); });
  if (name == "splitlines") {
    return fn([s](CallArgs&) {
      List out;
      size_t start = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
          out.push_back(Value::string(s.substr(start, k - start)));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          start = k + 1;
        }
      }
      if (start < s.size()) out.push_back(Value::string(s.substr(start)));
      return Value::make_list(std::move(out));
    });
  }
  if (name == "isdigit") return fn([s](CallArgs&) { return Value::boolean(all_chars(s, ::isdigit)); });
  if (name == "isalpha") return fn([s](CallArgs&) { return Value::boolean(all_chars(s, ::isalpha)); });
  if (name == "isalnum") return fn([s](CallArgs&) { return Value::boolean(all_chars(s, ::isalnum)); });
  if (name == "isspace") return fn([s](CallArgs&) { return Value::boolean(all_chars(s, ::isspace)); });
  if (name == "islower") {
    return fn([s](CallArgs&) { return Value::boolean(s != ascii_upper(s) && s == ascii_lower(s)); });
  }
  if (name == "isupper") {
    return fn([s](CallArgs&) { return Value::boolean(s != ascii_lower(s) && s == ascii_upper(s)); });
  }
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& obj, const std::string& name) {
  const std::shared_ptr<Dict> d = obj.dict;
  auto fn = [&](auto body) { return Value::function("dict." + name, body); };
  if (name == "items") {
    return fn([d](CallArgs&) {
      List out;
      for (const auto& [k, v] : d->items) out.push_back(Value::make_list({k, v}, true));
      return Value::make_view(std::move(out), "dict_items");
    });
  }
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return fn([d, keys](CallArgs&) {
      List out;
      for (const auto& [k, v] : d->items) out.push_back(keys ? k : v);
      return Value::make_view(std::move(out), keys ? "dict_keys" : "dict_values");
    });
  }
  if (name == "get") {
    return fn([d](CallArgs& a) {
      if (a.pos.empty()) fail("dict.get() takes a key");
      if (const Value* v = d->find(a.pos[0])) return *v;
      return a.pos.size() > 1 ? a.pos[1] : Value::none();
    });
  }
  if (name == "copy") {
    return fn([d](CallArgs&) {
      Value c = Value::make_dict();
      c.dict->items = d->items;
      return c;
    });
  }
  if (name == "update") {
    return fn([d](CallArgs& a) {
      for (const Value& p : a.pos) {
        if (!p.is_dict()) fail("dict.update() expects a dict");
        for (const auto& [k, v] : p.dict->items) d->set(k, v);
      }
      for (const auto& [k, v] : a.kw) d->set(Value::string(k), v);
      return Value::none();
    });
  }
  if (name == "pop" || name == "setdefault") {
    const bool pop = name == "pop";
    return fn([d, pop](CallArgs& a) {
      if (a.pos.empty()) fail("dict.pop()/setdefault() takes a key");
      for (size_t k = 0; k < d->items.size(); ++k) {
        if (!equals(d->items[k].first, a.pos[0])) continue;
        Value v = d->items[k].second;
        if (pop) d->items.erase(d->items.begin() + long(k));
        return v;
      }
      Value dflt = a.pos.size() > 1 ? a.pos[1] : Value::none();
      if (pop) {
        if (a.pos.size() < 2) fail("KeyError: " + a.pos[0].repr());
      } else {
        d->set(a.pos[0], dflt);
      }
      return dflt;
    });
  }
  return std::nullopt;
}

std::optional<Value> list_method(const Value& obj, const std::string& name) {
  const std::shared_ptr<List> l = obj.list;
  auto fn = [&](auto body) { return Value::function("list." + name, body); };
  if (obj.view != nullptr) return std::nullopt;
  if (name == "index" || name == "count") {
    const bool index = name == "index";
    return fn([l, index](CallArgs& a) {
      if (a.pos.empty()) fail("list.index()/count() takes an argument");
      int64_t n = 0;
      for (size_t k = 0; k < l->size(); ++k) {
        if (!equals((*l)[k], a.pos[0])) continue;
        if (index) return Value::integer(int64_t(k));
        ++n;
      }
      if (index) fail(a.pos[0].repr() + " is not in list");
      return Value::integer(n);
    });
  }
  if (obj.tuple) return std::nullopt;
  if (name == "append") {
    return fn([l](CallArgs& a) {
      if (a.pos.size() != 1) fail("list.append() takes exactly one argument");
      l->push_back(a.pos[0]);
      return Value::none();
    });
  }
  if (name == "extend") {
    return fn([l](CallArgs& a) {
      if (a.pos.size() != 1) fail("list.extend() takes exactly one argument");
      for (const Value& v : iterate(a.pos[0])) l->push_back(v);
      return Value::none();
    });
  }
  if (name == "insert") {
    return fn([l](CallArgs& a) {
      if (a.pos.size() != 2) fail("list.insert() takes exactly two arguments");
      int64_t i = a.pos[0].as_int();
      const auto n = int64_t(l->size());
      if (i < 0) i = std::max<int64_t>(0, i + n);
      l->insert(l->begin() + long(std::min(i, n)), a.pos[1]);
      return Value::none();
    });
  }
  if (name == "pop") {
    return fn([l](CallArgs& a) {
      if (l->empty()) fail("pop from empty list");
      int64_t i = a.pos.empty() ? -1 : a.pos[0].as_int();
      if (i < 0) i += int64_t(l->size());
      if (i < 0 || i >= int64_t(l->size())) fail("pop index out of range");
      Value v = (*l)[size_t(i)];
      l->erase(l->begin() + long(i));
      return v;
    });
  }
  if (name == "copy") return fn([l](CallArgs&) { return Value::make_list(*l); });
  return std::nullopt;
}

}  // namespace

std::optional<Value> bound_method(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::string: return string_method(obj, name);
    case Kind::dict: return dict_method(obj, name);
    case Kind::list: return list_method(obj, name);
    default: return std::nullopt;
  }
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  const bool nums = a.is_number() && b.is_number();
  const bool ints = is_int(a) && is_int(b);
  if (op == "+") {
    if (ints) return Value::integer(a.as_int() + b.as_int());
    if (nums) return Value::floating(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.markup) return Value::string(a.s + (b.markup ? b.s : html_escape(b.s)), true);
      if (b.markup) return Value::string(html_escape(a.s) + b.s, true);
      return Value::string(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple && a.view == nullptr && b.view == nullptr) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(out), a.tuple);
    }
    bad_operands(op, a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(a.as_int() - b.as_int());
    if (nums) return Value::floating(a.as_double() - b.as_double());
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(a.as_int() * b.as_int());
    if (nums) return Value::floating(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && is_int(b)) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && is_int(a)) return repeat(b, a.as_int());
    bad_operands(op, a, b);
  }
  if (op == "/") {
    if (!nums) bad_operands(op, a, b);
    if (b.as_double() == 0) fail("division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b), a.markup);
    if (!nums) bad_operands(op, a, b);
    if (b.as_double() == 0) fail(op == "%" ? "modulo by zero" : "division by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    const double x = a.as_double(), y = b.as_double();
    const double q = std::floor(x / y);
    if (op == "//") return Value::floating(q);
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::floating(r);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < b.as_int(); ++k) r *= a.as_int();
      return Value::integer(r);
    }
    if (nums) return Value::floating(std::pow(a.as_double(), b.as_double()));
    bad_operands(op, a, b);
  }
  fail("unknown operator " + op);
}

Value attribute_path(Evaluator& ev, const Value& item, const Value& path) {
  if (!path.is_string()) return ev.get_item(item, path);
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.s.find('.', start);
    const std::string part = path.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = ev.get_item(v, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::string percent_format(const std::string& fmt, const Value& args) {
  List items = args.is_list() && args.tuple ? *args.list : List{args};
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (++k >= fmt.size()) fail("incomplete format");
    if (fmt[k] == '%') {
      out += '%';
      continue;
    }
    const Value* named = nullptr;
    if (fmt[k] == '(') {
      const size_t close = fmt.find(')', k);
      if (close == std::string::npos || !args.is_dict()) fail("format requires a mapping");
      named = args.dict->find(std::string_view(fmt).substr(k + 1, close - k - 1));
      if (named == nullptr) fail("KeyError: " + fmt.substr(k + 1, close - k - 1));
      k = close + 1;
    }
    std::string spec = "%";
    while (k < fmt.size() && std::strchr("-+ #0123456789.", fmt[k]) != nullptr) spec += fmt[k++];
    if (k >= fmt.size()) fail("incomplete format");
    const char conv = fmt[k];
    const Value& v = named != nullptr ? *named : (next < items.size() ? items[next++] : (fail("not enough arguments for format string"), items[0]));
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string text = conv == 's' ? v.str() : v.repr();
        std::snprintf(buf, sizeof buf, (spec + "s").c_str(), text.c_str());
        out += buf;
        break;
      }
      case 'd':
      case 'i':
        std::snprintf(buf, sizeof buf, (spec + "lld").c_str(), static_cast<long long>(v.kind == Kind::floating ? int64_t(v.f) : v.as_int()));
        out += buf;
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'g':
      case 'x':
      case 'X':
        if (conv == 'x' || conv == 'X') {
          std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), static_cast<long long>(v.as_int()));
        } else {
          std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
        }
        out += buf;
        break;
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  return out;
}

std::string brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '{' && k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
    } else if (c == '}' && k + 1 < fmt.size() && fmt[k + 1] == '}') {
      out += '}';
      ++k;
    } else if (c == '{') {
      const size_t close = fmt.find('}', k);
      if (close == std::string::npos) fail("single '{' encountered in format string");
      std::string field = fmt.substr(k + 1, close - k - 1);
      const size_t colon = field.find(':');
      if (colon != std::string::npos) {
        if (colon + 1 != field.size()) fail("format specs in str.format are not supported");
        field.resize(colon);
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.pos.size() ? &args.pos[auto_index++] : nullptr;
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        const size_t i = std::stoul(field);
        v = i < args.pos.size() ? &args.pos[i] : nullptr;
      } else {
        for (const auto& [kn, kv] : args.kw) {
          if (kn == field) v = &kv;
        }
      }
      if (v == nullptr) fail("str.format: no argument for {" + field + "}");
      out += v->str();
      k = close;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace tessera::jinja
