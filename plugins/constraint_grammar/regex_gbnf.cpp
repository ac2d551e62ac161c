#include "regex_gbnf.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "gbnf_text.h"
#include "tessera/error.h"

namespace tessera::grammar {

namespace {

constexpr int kUnbounded = -1;
// Larger counts would expand into grammars too big to be useful; refusing says so plainly.
constexpr int kMaxRepeat = 1000;

struct Node {
  enum class Kind { Set, Seq, Alt, Repeat } kind;
  CodeRanges set;                            // Set
  std::vector<std::unique_ptr<Node>> items;  // Seq, Alt; Repeat: one child
  int min = 0, max = 0;                      // Repeat
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make(Node::Kind kind) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  return n;
}

NodePtr make_set(CodeRanges set) {
  auto n = make(Node::Kind::Set);
  normalize_ranges(set);
  n->set = std::move(set);
  return n;
}

CodeRanges digit_set() { return {{'0', '9'}}; }
CodeRanges word_set() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
// ECMA-262 WhiteSpace and LineTerminator.
CodeRanges space_set() {
  return {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
          {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
CodeRanges dot_set() { return complement_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

struct TopAlternative {
  NodePtr body;
  bool anchored_start = false;
  bool anchored_end = false;
};

class RegexParser {
 public:
  explicit RegexParser(std::string_view pattern) : text_(decode_utf8(pattern, "regex")) {}

  std::vector<TopAlternative> parse() {
    std::vector<TopAlternative> alts;
    while (true) {
      TopAlternative alt;
      if (peek() == '^') { ++pos_; alt.anchored_start = true; }
      alt.body = parse_seq(/*top=*/true, &alt.anchored_end);
      alts.push_back(std::move(alt));
      if (at_end()) break;
      if (peek() == '|') { ++pos_; continue; }
      fail("unmatched ')'");
    }
    return alts;
  }

 private:
  std::u32string text_;
  size_t pos_ = 0;

  bool at_end() const { return pos_ >= text_.size(); }
  char32_t peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : 0; }

  [[noreturn]] void fail(const std::string& what, size_t at) const {
    throw Error("regex: " + what + " at position " + std::to_string(at) + " (unsupported or invalid)");
  }
  [[noreturn]] void fail(const std::string& what) const { fail(what, pos_); }

  NodePtr parse_alt() {
    auto alt = make(Node::Kind::Alt);
    alt->items.push_back(parse_seq(false, nullptr));
    while (peek() == '|' && !at_end()) {
      ++pos_;
      alt->items.push_back(parse_seq(false, nullptr));
    }
    if (alt->items.size() == 1) return std::move(alt->items.front());
    return alt;
  }

  NodePtr parse_seq(bool top, bool* anchored_end) {
    auto seq = make(Node::Kind::Seq);
    while (!at_end()) {
      const char32_t c = peek();
      if (c == '|' || c == ')') break;
      if (c == '$') {
        // An end anchor only where nothing can follow it inside this top-level alternative.
        if (top && (pos_ + 1 == text_.size() || text_[pos_ + 1] == '|')) {
          ++pos_;
          *anchored_end = true;
          break;
        }
        fail("anchor '$' not at the end of the pattern");
      }
      if (c == '^') fail("anchor '^' not at the start of the pattern");
      const size_t atom_pos = pos_;
      NodePtr atom = parse_atom();
      atom = parse_quantifier(std::move(atom), atom_pos);
      seq->items.push_back(std::move(atom));
    }
    return seq;
  }

  std::optional<int> read_number() {
    size_t start = pos_;
    long long v = 0;
    while (peek() >= '0' && peek() <= '9' && !at_end()) {
      v = v * 10 + (peek() - '0');
      if (v > 1000000) v = 1000000;
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return static_cast<int>(v);
  }

  // {n} {n,} {n,m} at pos_ (which is '{'); nullopt (pos_ unchanged) when it is a literal brace.
  std::optional<std::pair<int, int>> read_braces() {
    const size_t start = pos_;
    ++pos_;
    auto lo = read_number();
    if (!lo) { pos_ = start; return std::nullopt; }
    int hi = *lo;
    if (peek() == ',') {
      ++pos_;
      auto m = read_number();
      hi = m ? *m : kUnbounded;
    }
    if (peek() != '}' || at_end()) { pos_ = start; return std::nullopt; }
    ++pos_;
    return std::make_pair(*lo, hi);
  }

  NodePtr parse_quantifier(NodePtr atom, size_t atom_pos) {
    while (!at_end()) {
      const size_t qpos = pos_;
      int lo = 0, hi = 0;
      const char32_t c = peek();
      if (c == '*') { lo = 0; hi = kUnbounded; ++pos_; }
      else if (c == '+') { lo = 1; hi = kUnbounded; ++pos_; }
      else if (c == '?') { lo = 0; hi = 1; ++pos_; }
      else if (c == '{') {
        auto b = read_braces();
        if (!b) return atom;
        lo = b->first;
        hi = b->second;
        if (hi != kUnbounded && hi < lo) fail("quantifier {n,m} with n > m", qpos);
        if (lo > kMaxRepeat || hi > kMaxRepeat) fail("repetition count above " + std::to_string(kMaxRepeat), qpos);
      } else {
        return atom;
      }
      if (peek() == '?' && !at_end()) ++pos_;  // lazy: same language
      if (peek() == '+' && !at_end()) fail("possessive quantifier");
      auto rep = make(Node::Kind::Repeat);
      rep->min = lo;
      rep->max = hi;
      rep->items.push_back(std::move(atom));
      atom = std::move(rep);
      // ECMA forbids a quantifier directly on a quantifier (a** is a syntax error).
      if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?')) fail("nothing to repeat");
      if (!at_end() && peek() == '{') {
        const size_t save = pos_;
        if (read_braces()) fail("nothing to repeat", save);
      }
    }
    (void)atom_pos;
    return atom;
  }

  NodePtr parse_atom() {
    const char32_t c = peek();
    const size_t start = pos_;
    switch (c) {
      case '(': {
        ++pos_;
        if (peek() == '?') {
          const char32_t k = peek(1);
          if (k == ':') {
            pos_ += 2;
          } else if (k == '=' || k == '!') {
            fail("lookahead (?" + std::string(1, static_cast<char>(k)) + "...)", start);
          } else if (k == '<' && (peek(2) == '=' || peek(2) == '!')) {
            fail("lookbehind (?<" + std::string(1, static_cast<char>(peek(2))) + "...)", start);
          } else if (k == '<') {
            pos_ += 2;
            while (!at_end() && peek() != '>') ++pos_;
            if (at_end()) fail("unterminated group name", start);
            ++pos_;
          } else {
            fail("group modifier (?" + std::string(k < 0x80 && k ? 1 : 0, static_cast<char>(k)) + "...)", start);
          }
        }
        NodePtr inner = parse_alt();
        if (peek() != ')' || at_end()) fail("unterminated group", start);
        ++pos_;
        return inner;
      }
      case '[': return parse_class();
      case '.': ++pos_; return make_set(dot_set());
      case '\\': return make_set(parse_escape(false));
      case '*': case '+': case '?': fail("nothing to repeat");
      case '{': {
        if (read_braces()) fail("nothing to repeat", start);
        ++pos_;
        return make_set({{c, c}});
      }
      default: ++pos_; return make_set({{c, c}});
    }
  }

  unsigned hex_value(char32_t c) const {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 16;
  }

  char32_t read_hex(int digits, size_t start) {
    char32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const unsigned h = hex_value(peek());
      if (h >= 16 || at_end()) fail("bad hex escape", start);
      v = v * 16 + h;
      ++pos_;
    }
    return v;
  }

  // After a backslash (pos_ at '\\'). in_class: \b is backspace, and \B, \-, are read as inside [...].
  CodeRanges parse_escape(bool in_class) {
    const size_t start = pos_;
    ++pos_;
    if (at_end()) fail("trailing backslash", start);
    const char32_t c = peek();
    ++pos_;
    auto one = [](char32_t cp) { return CodeRanges{{cp, cp}}; };
    switch (c) {
      case 'd': return digit_set();
      case 'D': return complement_ranges(digit_set());
      case 'w': return word_set();
      case 'W': return complement_ranges(word_set());
      case 's': { auto s = space_set(); normalize_ranges(s); return s; }
      case 'S': { auto s = space_set(); normalize_ranges(s); return complement_ranges(s); }
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'b':
        if (in_class) return one('\b');
        fail("word boundary \\b", start);
      case 'B': fail("word boundary \\B", start);
      case '0':
        if (peek() >= '0' && peek() <= '9' && !at_end()) fail("octal escape", start);
        return one(0);
      case 'x': return one(read_hex(2, start));
      case 'u': {
        if (peek() == '{') {
          ++pos_;
          char32_t v = 0;
          int n = 0;
          while (!at_end() && peek() != '}') {
            const unsigned h = hex_value(peek());
            if (h >= 16 || ++n > 6) fail("bad \\u{...} escape", start);
            v = v * 16 + h;
            ++pos_;
          }
          if (at_end() || n == 0 || v > 0x10FFFF) fail("bad \\u{...} escape", start);
          ++pos_;
          return one(v);
        }
        char32_t v = read_hex(4, start);
        // A surrogate pair written as two escapes is one code point.
        if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
          const size_t save = pos_;
          pos_ += 2;
          char32_t lo = read_hex(4, start);
          if (lo >= 0xDC00 && lo <= 0xDFFF) return one(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
          pos_ = save;
        }
        if (v >= 0xD800 && v <= 0xDFFF) fail("lone surrogate escape", start);
        return one(v);
      }
      case 'c': {
        const char32_t l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')) || at_end()) fail("bad \\c escape", start);
        ++pos_;
        return one(l % 32);
      }
      case 'p': case 'P': fail("Unicode property escape \\" + std::string(1, static_cast<char>(c)), start);
      case 'k': fail("named backreference \\k", start);
      default: break;
    }
    if (c >= '1' && c <= '9') fail("backreference \\" + std::string(1, static_cast<char>(c)), start);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
      fail("unknown escape \\" + std::string(1, static_cast<char>(c)), start);
    return one(c);  // escaped punctuation (or any other non-alphanumeric) is itself
  }

  NodePtr parse_class() {
    const size_t start = pos_;
    ++pos_;
    bool negated = false;
    if (peek() == '^' && !at_end()) { negated = true; ++pos_; }
    CodeRanges set;
    while (true) {
      if (at_end()) fail("unterminated character class", start);
      if (peek() == ']') { ++pos_; break; }
      // One class atom: a single code point (can start a range) or a set escape like \d.
      auto atom = [&]() -> CodeRanges {
        if (peek() == '\\') return parse_escape(true);
        const char32_t c = peek();
        ++pos_;
        return {{c, c}};
      };
      CodeRanges first = atom();
      const bool first_single = first.size() == 1 && first[0].first == first[0].second;
      if (first_single && peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        const size_t dash = pos_;
        ++pos_;
        CodeRanges second = atom();
        const bool second_single = second.size() == 1 && second[0].first == second[0].second;
        if (second_single) {
          if (second[0].first < first[0].first) fail("class range out of order", dash);
          set.emplace_back(first[0].first, second[0].first);
          continue;
        }
        // [a-\d]: the dash is a literal (Annex B).
        set.insert(set.end(), first.begin(), first.end());
        set.emplace_back('-', '-');
        set.insert(set.end(), second.begin(), second.end());
        continue;
      }
      set.insert(set.end(), first.begin(), first.end());
    }
    normalize_ranges(set);
    if (negated) set = complement_ranges(set);
    if (set.empty()) fail("character class that matches nothing", start);
    return make_set(std::move(set));
  }
};

// ---- emission ----

class Emitter {
 public:
  Emitter(bool json_string, std::string any_rule) : json_(json_string), any_rule_(std::move(any_rule)) {}

  // GBNF expression for a node; "" when it matches only the empty string.
  std::string emit(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Set: return emit_set(n.set);
      case Node::Kind::Seq: return emit_seq(n);
      case Node::Kind::Alt: {
        std::vector<std::string> parts;
        bool has_empty = false;
        for (const auto& item : n.items) {
          std::string e = emit(*item);
          if (e.empty()) has_empty = true; else parts.push_back(std::move(e));
        }
        if (parts.empty()) return "";
        std::string joined = "(" + join(parts, " | ") + ")";
        return has_empty ? joined + "?" : joined;
      }
      case Node::Kind::Repeat: {
        std::string e = emit(*n.items.front());
        if (e.empty() || n.max == 0) return "";
        if (!is_atomic(e)) e = "(" + e + ")";
        if (n.min == 0 && n.max == kUnbounded) return e + "*";
        if (n.min == 1 && n.max == kUnbounded) return e + "+";
        if (n.min == 0 && n.max == 1) return e + "?";
        if (n.min == 1 && n.max == 1) return e;
        if (n.max == kUnbounded) return e + "{" + std::to_string(n.min) + ",}";
        if (n.min == n.max) return e + "{" + std::to_string(n.min) + "}";
        return e + "{" + std::to_string(n.min) + "," + std::to_string(n.max) + "}";
      }
    }
    return "";
  }

  // What an open (unanchored) side accepts.
  std::string any_text() const { return json_ ? any_rule_ + "*" : ".*"; }

 private:
  bool json_;
  std::string any_rule_;

  static std::string join(const std::vector<std::string>& parts, const char* sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) out += sep;
      out += parts[i];
    }
    return out;
  }

  // A single literal, class, rule name or parenthesised group takes a postfix operator as is.
  static bool is_atomic(const std::string& e) {
    if (e.empty()) return true;
    int depth = 0;
    bool in_str = false, in_cls = false;
    for (size_t i = 0; i < e.size(); ++i) {
      const char c = e[i];
      if (c == '\\') { ++i; continue; }
      if (in_str) { if (c == '"') in_str = false; continue; }
      if (in_cls) { if (c == ']') in_cls = false; continue; }
      if (c == '"') in_str = true;
      else if (c == '[') in_cls = true;
      else if (c == '(') ++depth;
      else if (c == ')') --depth;
      else if (depth == 0 && (c == ' ' || c == '|')) return false;
    }
    // "(a)*" ends in an operator: wrap it again before another one.
    const char last = e.back();
    return !(last == '*' || last == '+' || last == '?' || last == '}');
  }

  // The text a single code point is written as: itself, or its JSON escape inside a JSON string.
  std::u32string encode(char32_t cp) const {
    if (!json_) return std::u32string(1, cp);
    switch (cp) {
      case '"': return U"\\\"";
      case '\\': return U"\\\\";
      case '\b': return U"\\b";
      case '\f': return U"\\f";
      case '\n': return U"\\n";
      case '\r': return U"\\r";
      case '\t': return U"\\t";
      default: break;
    }
    if (cp < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      std::u32string out;
      for (const char* p = buf; *p; ++p) out += static_cast<char32_t>(*p);
      return out;
    }
    return std::u32string(1, cp);
  }

  std::string emit_set(const CodeRanges& set) {
    if (set.size() == 1 && set[0].first == set[0].second) return gbnf_literal(encode(set[0].first));
    if (!json_) return gbnf_class(set);
    // Inside a JSON string: the characters written as themselves form one class; quote, backslash and
    // control characters are alternatives written as their escapes.
    CodeRanges plain;
    std::vector<char32_t> escaped;
    for (const auto& [lo, hi] : set) {
      for (char32_t c = lo; c <= hi && c < 0x20; ++c) escaped.push_back(c);
      char32_t plo = std::max<char32_t>(lo, 0x20);
      if (plo > hi) continue;
      // Split out '"' (0x22) and '\\' (0x5C).
      char32_t cur = plo;
      for (char32_t special : {char32_t('"'), char32_t('\\')}) {
        if (special < cur || special > hi) continue;
        if (special > cur) plain.emplace_back(cur, special - 1);
        escaped.push_back(special);
        cur = special + 1;
      }
      if (cur <= hi) plain.emplace_back(cur, hi);
    }
    std::vector<std::string> alts;
    if (!plain.empty()) alts.push_back(plain.size() == 1 && plain[0].first == plain[0].second
                                           ? gbnf_literal(encode(plain[0].first))
                                           : gbnf_class(plain));
    size_t controls = 0;
    for (char32_t c : escaped) controls += c < 0x20;
    for (char32_t c : escaped) {
      if (c < 0x20 && controls == 0x20) continue;
      alts.push_back(gbnf_literal(encode(c)));
    }
    if (controls == 0x20) alts.push_back("\"\\\\u00\" [01] [0-9a-f]");
    if (alts.size() == 1) return alts.front();
    return "(" + join(alts, " | ") + ")";
  }

  std::string emit_seq(const Node& n) {
    std::vector<std::string> parts;
    std::u32string literal;
    auto flush = [&] {
      if (!literal.empty()) parts.push_back(gbnf_literal(literal));
      literal.clear();
    };
    for (const auto& item : n.items) {
      if (item->kind == Node::Kind::Set && item->set.size() == 1 && item->set[0].first == item->set[0].second) {
        literal += encode(item->set[0].first);
        continue;
      }
      flush();
      std::string e = emit(*item);
      if (!e.empty()) parts.push_back(std::move(e));
    }
    flush();
    return join(parts, " ");
  }
};

std::string alternatives_expr(const std::vector<TopAlternative>& alts, Emitter& emitter, bool whole_match) {
  std::vector<std::string> parts;
  bool has_empty = false;
  for (const auto& alt : alts) {
    std::string body = emitter.emit(*alt.body);
    if (!whole_match) {
      if (!alt.anchored_start) body = emitter.any_text() + (body.empty() ? "" : " " + body);
      if (!alt.anchored_end) body = body + (body.empty() ? "" : " ") + emitter.any_text();
    }
    if (body.empty()) has_empty = true; else parts.push_back(body);
  }
  if (parts.empty()) return "";
  if (parts.size() == 1 && !has_empty) return parts.front();
  std::string out = "(";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? " | " : "") + parts[i];
  out += ")";
  return has_empty ? out + "?" : out;
}

}  // namespace

std::string regex_to_gbnf(std::string_view pattern, std::string_view root_name, bool whole_match) {
  const auto alts = RegexParser(pattern).parse();
  Emitter emitter(false, "");
  std::string body = alternatives_expr(alts, emitter, whole_match);
  if (body.empty()) body = "\"\"";
  return std::string(root_name) + " ::= " + body + "\n";
}

std::string regex_to_json_string_gbnf(std::string_view pattern, std::string_view json_char_rule) {
  const auto alts = RegexParser(pattern).parse();
  Emitter emitter(true, std::string(json_char_rule));
  return alternatives_expr(alts, emitter, false);
}

}  // namespace tessera::grammar
