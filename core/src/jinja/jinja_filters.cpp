// Jinja2's builtin filters and tests (jinja2/filters.py, jinja2/tests.py), with transformers'
// tojson (json.dumps with ensure_ascii=False, no HTML escaping, keys in insertion order).
// Filters that return generators in Jinja2 (map, select, unique...) return lists here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "jinja_eval.h"

namespace tessera::jinja {

namespace {

bool flag_arg(const CallArgs& a, size_t i, const char* name, bool dflt) {
  const Value* v = a.get(i, name);
  return v != nullptr ? v->truthy() : dflt;
}

// str.splitlines() (without keepends), for the indent filter.
std::vector<std::string> splitlines(const std::string& s) {
  std::vector<std::string> lines;
  const std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<uint32_t> cur;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      cur.push_back(c);
      continue;
    }
    if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
    lines.push_back(encode_utf8(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(encode_utf8(cur));
  return lines;
}

std::string do_indent(const std::string& text, const Value* width, bool first, bool blank) {
  std::string ind = "    ";
  if (width != nullptr) ind = width->is_string() ? width->s : std::string(size_t(std::max<int64_t>(0, width->as_int())), ' ');
  std::vector<std::string> lines = splitlines(text + "\n");
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k > 0 ? "\n" + ind : std::string()) + lines[k];
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? std::string() : ind + lines[k]);
  }
  return first ? ind + rv : rv;
}

std::string do_title(const std::string& s) {
  std::string out;
  bool at_start = true;
  for (uint32_t cp : decode_utf8(s)) {
    const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_py_space(cp);
    if (sep) {
      at_start = true;
      append_utf8(out, cp);
      continue;
    }
    std::string c;
    append_utf8(c, cp);
    out += at_start ? ascii_upper(c) : ascii_lower(c);
    at_start = false;
  }
  return out;
}

Value parse_int(const Value& v, const Value& dflt, int base) {
  switch (v.kind) {
    case Kind::integer:
    case Kind::boolean: return Value::integer(v.as_int());
    case Kind::floating:
      if (!std::isfinite(v.f)) fail("cannot convert float " + float_repr(v.f) + " to integer");
      return Value::integer(static_cast<int64_t>(v.f));
    case Kind::string: {
      std::string t;
      for (char c : py_strip(v.s, nullptr, true, true)) {
        if (c != '_') t += c;
      }
      if (!t.empty()) {
        size_t used = 0;
        try {
          const long long r = std::stoll(t, &used, base);
          if (used == t.size()) return Value::integer(r);
        } catch (const std::exception&) {
        }
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (end == t.c_str() + t.size() && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
      }
      return dflt;
    }
    default: return dflt;
  }
}

Value parse_float(const Value& v, const Value& dflt) {
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    const std::string t = py_strip(v.s, nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(t.c_str(), &end);
    if (!t.empty() && end == t.c_str() + t.size()) return Value::floating(d);
  }
  return dflt;
}

double py_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits == 0) return std::nearbyint(x);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", int(std::clamp<int64_t>(digits, 0, 300)), x);
  return std::strtod(buf, nullptr);
}

// The key a sort/unique/min/max compares: the item or its attribute, strings lowercased unless
// case_sensitive.
Value sort_key(Evaluator& ev, const Value& item, const Value* attribute) {
  return attribute != nullptr && !attribute->is_none() ? attribute_path(ev, item, *attribute) : item;
}

List select_items(Evaluator& ev, const Value& seq, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  Value attr;
  if (by_attr) {
    if (a.pos.empty()) fail("selectattr/rejectattr need an attribute name");
    attr = a.pos[next++];
  }
  std::string test_name;
  if (next < a.pos.size()) test_name = a.pos[next++].str();
  CallArgs test_args;
  test_args.pos.assign(a.pos.begin() + long(next), a.pos.end());
  test_args.kw = a.kw;
  List out;
  if (!seq.truthy()) return out;  // Jinja2: `if value:` before iterating (none selects nothing)
  for (const Value& item : iterate(seq)) {
    const Value v = by_attr ? attribute_path(ev, item, attr) : item;
    const bool ok = test_name.empty() ? v.truthy() : ev.test(test_name, v, test_args);
    if (ok == keep) out.push_back(item);
  }
  return out;
}

std::string require_string_name(const Value* v, const char* what) {
  if (v == nullptr || !v->is_string()) fail(std::string(what) + " expects a name");
  return v->s;
}

}  // namespace

Value apply_filter(Evaluator& ev, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "tojson") {
    JsonStyle st;
    st.ensure_ascii = flag_arg(a, 0, "ensure_ascii", false);
    const Value* indent = a.get(1, "indent");
    if (indent != nullptr && !indent->is_none()) {
      st.has_indent = true;
      st.indent = indent->is_string() ? indent->s : std::string(size_t(std::max<int64_t>(0, indent->as_int())), ' ');
      st.item_sep = ",";
    }
    const Value* seps = a.get(2, "separators");
    if (seps != nullptr && !seps->is_none()) {
      const List parts = iterate(*seps);
      if (parts.size() != 2) fail("tojson separators must be a pair of strings");
      st.item_sep = parts[0].str();
      st.key_sep = parts[1].str();
    }
    st.sort_keys = flag_arg(a, 3, "sort_keys", false);
    return Value::string(to_json(v, st));
  }
  if (name == "trim") {
    const Value* chars = a.get(0, "chars");
    return Value::string(py_strip(v.str(), chars != nullptr && chars->is_string() ? &chars->s : nullptr, true, true),
                         v.markup);
  }
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "upper") return Value::string(ascii_upper(v.str()), v.markup);
  if (name == "lower") return Value::string(ascii_lower(v.str()), v.markup);
  if (name == "title") return Value::string(do_title(v.str()), v.markup);
  if (name == "capitalize") {
    std::string s = ascii_lower(v.str());
    if (!s.empty()) s[0] = ascii_upper(s.substr(0, 1))[0];
    return Value::string(s, v.markup);
  }
  if (name == "replace") {
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (from == nullptr || to == nullptr) fail("replace expects old and new strings");
    CallArgs m;
    m.pos = {Value::string(from->str()), Value::string(to->str())};
    if (const Value* c = a.get(2, "count"); c != nullptr && !c->is_none()) m.pos.push_back(*c);
    return ev.call(*bound_method(Value::string(v.str()), "replace"), m);
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first && sep != nullptr) out += sep->str();
      first = false;
      out += (attr != nullptr && !attr->is_none() ? attribute_path(ev, item, *attr) : item).str();
    }
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    const Value* dflt = a.get(0, "default_value");
    const bool boolean = flag_arg(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return dflt != nullptr ? *dflt : Value::string("");
    return v;
  }
  if (name == "first" || name == "last") {
    if (name == "last" && v.is_iterator()) fail("'" + std::string(v.view) + "' object is not reversible");
    const List items = iterate(v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::make_view({}, "generator");
    if (!v.is_dict()) fail("can only get item pairs from a mapping");
    Value items = ev.call(*bound_method(v, "items"), a);
    items.view = "generator";
    return items;
  }
  if (name == "string") return v.is_string() ? v : Value::string(v.str());
  if (name == "int") {
    const Value* dflt = a.get(0, "default");
    const Value* base = a.get(1, "base");
    return parse_int(v, dflt != nullptr ? *dflt : Value::integer(0), base != nullptr ? int(base->as_int()) : 10);
  }
  if (name == "float") {
    const Value* dflt = a.get(0, "default");
    return parse_float(v, dflt != nullptr ? *dflt : Value::floating(0));
  }
  if (name == "round") {
    const Value* p = a.get(0, "precision");
    const Value* m = a.get(1, "method");
    const int64_t digits = p != nullptr ? p->as_int() : 0;
    const std::string method = m != nullptr ? m->str() : "common";
    if (method == "common") {
      if (v.kind == Kind::integer || v.kind == Kind::boolean) return Value::integer(v.as_int());
      return Value::floating(py_round(v.as_double(), digits));
    }
    if (method != "ceil" && method != "floor") fail("round method must be common, ceil or floor");
    const double scale = std::pow(10.0, double(digits));
    const double x = v.as_double() * scale;
    return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "abs") {
    if (v.kind == Kind::floating) return Value::floating(std::fabs(v.f));
    return Value::integer(std::llabs(v.as_int()));
  }
  if (name == "safe") return Value::string(v.str(), true);
  if (name == "escape" || name == "e" || name == "forceescape") {
    if (v.markup && name != "forceescape") return v;
    return Value::string(html_escape(v.str()), true);
  }
  if (name == "selectattr" || name == "rejectattr") return Value::make_view(select_items(ev, v, a, true, name == "selectattr"), "generator");
  if (name == "select" || name == "reject") return Value::make_view(select_items(ev, v, a, false, name == "select"), "generator");
  if (name == "map") {
    List out;
    if (!v.truthy()) return Value::make_view({}, "generator");
    const Value* attr = nullptr;
    for (const auto& [k, kv] : a.kw) {
      if (k == "attribute") attr = &kv;
    }
    if (a.pos.empty() && attr != nullptr) {
      const Value* dflt = nullptr;
      for (const auto& [k, kv] : a.kw) {
        if (k == "default") dflt = &kv;
      }
      for (const Value& item : iterate(v)) {
        Value r = attribute_path(ev, item, *attr);
        if (r.is_undefined() && dflt != nullptr) r = *dflt;
        out.push_back(std::move(r));
      }
      return Value::make_view(std::move(out), "generator");
    }
    const std::string fname = require_string_name(a.pos.empty() ? nullptr : &a.pos[0], "map");
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& item : iterate(v)) {
      CallArgs copy = rest;
      out.push_back(ev.filter(fname, item, copy));
    }
    return Value::make_view(std::move(out), "generator");
  }
  if (name == "unique") {
    const bool cs = flag_arg(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    List out, seen;
    for (const Value& item : iterate(v)) {
      Value key = sort_key(ev, item, attr);
      if (!cs && key.is_string()) key = Value::string(ascii_lower(key.s));
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Value::make_view(std::move(out), "generator");
  }
  if (name == "sort") {
    const bool reverse = flag_arg(a, 0, "reverse", false);
    const bool cs = flag_arg(a, 1, "case_sensitive", false);
    const Value* attr = a.get(2, "attribute");
    List items = iterate(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int c = compare(sort_key(ev, x, attr), sort_key(ev, y, attr), !cs);
      return reverse ? c > 0 : c < 0;
    });
    return Value::make_list(std::move(items));
  }
  if (name == "dictsort") {
    const bool cs = flag_arg(a, 0, "case_sensitive", false);
    const Value* by = a.get(1, "by");
    const bool reverse = flag_arg(a, 2, "reverse", false);
    if (!v.is_dict()) fail("dictsort expects a mapping");
    const size_t pos = by != nullptr && by->str() == "value" ? 1 : 0;
    List items;
    for (const auto& [k, e] : v.dict->items) items.push_back(Value::make_list({k, e}, true));
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int c = compare((*x.list)[pos], (*y.list)[pos], !cs);
      return reverse ? c > 0 : c < 0;
    });
    return Value::make_list(std::move(items));
  }
  if (name == "min" || name == "max") {
    const bool cs = flag_arg(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    const List items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k) {
      const int c = compare(sort_key(ev, items[k], attr), sort_key(ev, items[best], attr), !cs);
      if (name == "min" ? c < 0 : c > 0) best = k;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value* attr = a.get(0, "attribute");
    const Value* start = a.get(1, "start");
    Value total = start != nullptr ? *start : Value::integer(0);
    for (const Value& item : iterate(v)) total = arithmetic("+", total, sort_key(ev, item, attr));
    return total;
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<uint32_t> cps = decode_utf8(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(encode_utf8(cps), v.markup);
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return v.is_list() && v.view == nullptr ? Value::make_view(std::move(items), "list_reverseiterator")
                                            : Value::make_list(std::move(items));
  }
  if (name == "batch") {
    const Value* n = a.get(0, "linecount");
    const Value* fill = a.get(1, "fill_with");
    if (n == nullptr || n->as_int() <= 0) fail("batch expects a positive line count");
    List out, cur;
    for (const Value& item : iterate(v)) {
      cur.push_back(item);
      if (int64_t(cur.size()) == n->as_int()) {
        out.push_back(Value::make_list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (fill != nullptr && !fill->is_none()) {
        while (int64_t(cur.size()) < n->as_int()) cur.push_back(*fill);
      }
      out.push_back(Value::make_list(std::move(cur)));
    }
    return Value::make_view(std::move(out), "generator");
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (uint32_t cp : decode_utf8(v.str())) {
      // Python's \w: letters, digits, underscore; non-ASCII symbol blocks (punctuation, emoji) are not.
      const bool symbol = (cp >= 0xa1 && cp <= 0xbf && cp != 0xaa && cp != 0xb5 && cp != 0xba) || cp == 0xd7 ||
                          cp == 0xf7 || (cp >= 0x2000 && cp <= 0x2bff) || (cp >= 0x3000 && cp <= 0x303f) ||
                          (cp >= 0xfe00 && cp <= 0xfe0f) || (cp >= 0xff00 && cp <= 0xff0f) ||
                          (cp >= 0x1f000 && cp <= 0x1faff);
      const bool w = cp == '_' || (cp < 0x80 ? std::isalnum(int(cp)) != 0 : !is_py_space(cp) && !symbol);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "indent") {
    return Value::string(do_indent(v.str(), a.get(0, "width"), flag_arg(a, 1, "first", false), flag_arg(a, 2, "blank", false)),
                         v.markup);
  }
  if (name == "attr") return ev.get_attr(v, require_string_name(a.get(0, "name"), "attr"));
  if (name == "format") {
    if (!a.kw.empty()) {
      Value d = Value::make_dict();
      for (const auto& [k, kv] : a.kw) d.dict->set(Value::string(k), kv);
      return Value::string(percent_format(v.str(), d));
    }
    return Value::string(percent_format(v.str(), Value::make_list(a.pos, true)));
  }
  if (name == "center") {
    const Value* w = a.get(0, "width");
    const int64_t width = w != nullptr ? w->as_int() : 80;
    const std::string s = v.str();
    const int64_t len = int64_t(utf8_length(s));
    if (width <= len) return Value::string(s);
    const int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
    return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(pad - left), ' '));
  }
  if (name == "pprint") return Value::string(v.repr());
  fail("unknown filter '" + name + "'");
}

bool apply_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& a) {
  auto arg = [&](const char* what) -> const Value& {
    const Value* x = a.get(0, what);
    if (x == nullptr) fail("test '" + name + "' takes an argument");
    return *x;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Kind::boolean;
  if (name == "true") return v.kind == Kind::boolean && v.flag;
  if (name == "false") return v.kind == Kind::boolean && !v.flag;
  if (name == "integer") return v.kind == Kind::integer;
  if (name == "float") return v.kind == Kind::floating;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") return v.is_undefined() || v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace());
  if (name == "sequence") return v.is_undefined() || v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace());
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return v.is_string() && v.markup;
  if (name == "lower") return v.str() == ascii_lower(v.str());
  if (name == "upper") return v.str() == ascii_upper(v.str());
  if (name == "odd" || name == "even") {
    const int64_t n = v.as_int();
    return ((n % 2) != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = arg("num").as_int();
    if (d == 0) fail("integer division or modulo by zero");
    return v.as_int() % d == 0;
  }
  if (name == "in") return contains(arg("seq"), v);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg("other"));
  if (name == "ne" || name == "!=") return !equals(v, arg("other"));
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg("other")) < 0;
  if (name == "le" || name == "<=") return compare(v, arg("other")) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg("other")) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg("other")) >= 0;
  if (name == "sameas") {
    const Value& o = arg("other");
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    return equals(v, o);
  }
  if (name == "filter" || name == "test") {
    static const std::set<std::string> filters = {
        "tojson", "trim", "length", "count", "upper", "lower", "title", "capitalize", "replace", "join", "default",
        "d", "first", "last", "list", "items", "string", "int", "float", "round", "abs", "safe", "escape", "e",
        "forceescape", "selectattr", "rejectattr", "select", "reject", "map", "unique", "sort", "dictsort", "min",
        "max", "sum", "reverse", "batch", "wordcount", "indent", "attr", "format", "center", "pprint"};
    static const std::set<std::string> tests = {
        "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string",
        "mapping", "iterable", "sequence", "callable", "escaped", "lower", "upper", "odd", "even", "divisibleby",
        "in", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">",
        "ge", ">=", "sameas", "filter", "test"};
    const std::string what = arg("name").str();
    return name == "filter" ? filters.count(what) != 0 : tests.count(what) != 0;
  }
  (void)ev;
  fail("unknown test '" + name + "'");
}

}  // namespace tessera::jinja
