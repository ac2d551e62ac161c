// GBNF text -> Grammar. Groups and repetitions become generated rules (x* is R ::= x R | "", a tail
// call the matcher runs without growing its stack); character classes over code points become
// alternatives of UTF-8 byte ranges.
#include <algorithm>
#include <map>
#include <utility>

#include "gbnf_text.h"
#include "grammar.h"
#include "tessera/error.h"

namespace tessera::grammar {
namespace {

using Seq = std::vector<Element>;
using Range = std::pair<uint32_t, uint32_t>;  // code points, inclusive

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct Builder {
  std::vector<std::vector<Seq>> rules;
  std::vector<std::string> names;
  std::vector<size_t> used_at;  // text offset of the first reference, for "not defined" errors
  std::vector<bool> defined;
  std::map<std::string, uint32_t, std::less<>> by_name;
  std::map<std::string, uint32_t, std::less<>> generated;  // per parent: how many so far
  std::vector<ByteSet> sets;
  std::map<std::array<uint64_t, 4>, uint32_t> set_index;
  size_t elements = 0;

  uint32_t add_rule(std::string name) {
    const auto id = static_cast<uint32_t>(rules.size());
    rules.emplace_back();
    names.push_back(name);
    used_at.push_back(0);
    defined.push_back(false);
    by_name.emplace(std::move(name), id);
    return id;
  }
  uint32_t named(std::string_view name, size_t at) {
    if (auto it = by_name.find(name); it != by_name.end()) return it->second;
    const uint32_t id = add_rule(std::string(name));
    used_at[id] = at;
    return id;
  }
  // A generated rule, already defined by its caller.
  uint32_t fresh(std::string_view parent, std::vector<Seq> alternatives) {
    uint32_t& n = generated[std::string(parent)];
    std::string name;
    do name = std::string(parent) + "-" + std::to_string(++n);
    while (by_name.count(name) != 0);
    const uint32_t id = add_rule(std::move(name));
    for (const Seq& s : alternatives) elements += s.size() + 1;
    rules[id] = std::move(alternatives);
    defined[id] = true;
    return id;
  }
  Element set(const ByteSet& s) {
    auto [it, added] = set_index.emplace(s.bits, static_cast<uint32_t>(sets.size()));
    if (added) sets.push_back(s);
    return {Op::kBytes, it->second};
  }
  Element byte(uint8_t b) {
    ByteSet s;
    s.add(b);
    return set(s);
  }
};

// Splits [lo, hi] into ranges whose UTF-8 encodings are byte-wise ranges: each gives one sequence
// of byte sets (the usual construction of regex engines that match UTF-8 bytes).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<Range>>& out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t end : kLengthEnds) {
    if (lo <= end && end < hi) {
      utf8_sequences(lo, end, out);
      utf8_sequences(end + 1, hi, out);
      return;
    }
  }
  const int n = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  std::vector<Range> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out.push_back(std::move(seq));
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view where, Builder& b) : text_(text), where_(where), b_(b) {}

  void parse() {
    for (;;) {
      skip_space(true);
      if (eof()) break;
      const size_t start = pos_;
      const std::string name(parse_name());
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      skip_space(true);
      const uint32_t r = b_.named(name, start);
      if (b_.defined[r]) fail(start, "rule '" + name + "' is defined twice");
      b_.defined[r] = true;  // before its body: a self-reference is not "undefined"
      std::vector<Seq> alts = parse_alternatives(name, false);
      for (const Seq& s : alts) b_.elements += s.size() + 1;
      b_.rules[r] = std::move(alts);
      skip_space(false);
      if (!eof() && text_[pos_] != '\n' && text_[pos_] != '\r')
        fail(pos_, "unexpected '" + std::string(1, text_[pos_]) + "' (a rule ends at the end of its line)");
    }
    for (size_t r = 0; r < b_.rules.size(); ++r)
      if (!b_.defined[r]) fail(b_.used_at[r], "rule '" + b_.names[r] + "' is used but not defined");
    if (b_.by_name.count("root") == 0) fail(text_.size(), "no rule named 'root' (where the grammar starts)");
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error(std::string(where_) + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + what);
  }

 private:
  bool eof() const { return pos_ >= text_.size(); }

  void skip_space(bool newlines) {
    while (!eof()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && text_[pos_] != '\n') ++pos_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }

  std::string_view parse_name() {
    const size_t start = pos_;
    while (!eof() && name_char(text_[pos_])) ++pos_;
    if (pos_ == start) fail(start, eof() ? "expected a rule name" : "expected a rule name, found '" + std::string(1, text_[start]) + "'");
    return text_.substr(start, pos_ - start);
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (eof()) fail(pos_, "incomplete escape");
      const char c = text_[pos_];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail(pos_, "expected a hexadecimal digit in an escape");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    return v;
  }

  // One code point of a literal or class (escapes decoded), UTF-8 of the text checked.
  uint32_t parse_char() {
    const size_t start = pos_;
    const auto c = static_cast<unsigned char>(text_[pos_++]);
    uint32_t cp = 0;
    if (c == '\\') {
      if (eof()) fail(start, "incomplete escape");
      const char e = text_[pos_++];
      switch (e) {
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'x': cp = hex(2); break;
        case 'u': cp = hex(4); break;
        case 'U': cp = hex(8); break;
        case '\\': case '"': case '[': case ']': case '-': case '/': case '\'': case '^': cp = uint32_t(e); break;
        default: fail(start, "unknown escape '\\" + std::string(1, e) + "'");
      }
    } else if (c < 0x80) {
      cp = c;
    } else {
      const int n = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
      if (n < 0) fail(start, "invalid UTF-8 in the grammar text");
      cp = c & (0x3F >> n);
      for (int i = 0; i < n; ++i) {
        if (eof() || (static_cast<unsigned char>(text_[pos_]) & 0xC0) != 0x80) fail(start, "invalid UTF-8 in the grammar text");
        cp = (cp << 6) | (static_cast<unsigned char>(text_[pos_++]) & 0x3F);
      }
    }
    if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) fail(start, "not a Unicode scalar value: " + std::to_string(cp));
    return cp;
  }

  // A class as one element: a byte set when it is all ASCII, else a generated rule of UTF-8 sequences.
  Element lower_class(std::vector<Range> ranges, bool negate, std::string_view rule) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<Range> merged;
    for (const Range& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    }
    if (negate) {
      std::vector<Range> inv;
      uint32_t next = 0;
      for (const Range& r : merged) {
        if (r.first > next) inv.push_back({next, r.first - 1});
        next = r.second + 1;
      }
      if (next <= kMaxCodePoint) inv.push_back({next, kMaxCodePoint});
      merged = std::move(inv);
    }
    ByteSet ascii;
    bool any = false;
    std::vector<std::vector<Range>> multi;
    for (Range r : merged) {
      // Surrogates have no UTF-8 encoding.
      std::vector<Range> parts;
      if (r.first < 0xD800 && r.second > 0xDFFF) {
        parts = {{r.first, 0xD7FF}, {0xE000, r.second}};
      } else if (r.first >= 0xD800 && r.second <= 0xDFFF) {
        continue;
      } else {
        if (r.first >= 0xD800 && r.first <= 0xDFFF) r.first = 0xE000;
        if (r.second >= 0xD800 && r.second <= 0xDFFF) r.second = 0xD7FF;
        parts = {r};
      }
      for (const Range& p : parts) {
        if (p.first > p.second) continue;
        if (p.first < 0x80) {
          ascii.add_range(uint8_t(p.first), uint8_t(std::min<uint32_t>(p.second, 0x7F)));
          any = true;
        }
        if (p.second >= 0x80) utf8_sequences(std::max<uint32_t>(p.first, 0x80), p.second, multi);
      }
    }
    if (multi.empty()) {
      if (!any) fail(pos_, "the character class matches nothing");
      return b_.set(ascii);
    }
    std::vector<Seq> alts;
    if (any) alts.push_back({b_.set(ascii)});
    for (const auto& seq : multi) {
      Seq s;
      for (const Range& r : seq) {
        ByteSet bs;
        bs.add_range(uint8_t(r.first), uint8_t(r.second));
        s.push_back(b_.set(bs));
      }
      alts.push_back(std::move(s));
    }
    return {Op::kRule, b_.fresh(rule, std::move(alts))};
  }

  uint32_t parse_count() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (!eof() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + uint64_t(text_[pos_++] - '0');
      if (v > kMaxRepetition) fail(start, "repetition count over the limit of " + std::to_string(kMaxRepetition));
    }
    if (pos_ == start) fail(start, "expected a number in the repetition");
    return uint32_t(v);
  }

  uint32_t star(const Seq& atom, std::string_view rule) {
    Seq again = atom;
    const uint32_t id = b_.fresh(rule, {});
    again.push_back({Op::kRule, id});
    b_.elements += again.size() + 2;
    b_.rules[id] = {std::move(again), Seq{}};
    return id;
  }

  void repeat(Seq& seq, size_t atom_start, uint32_t min, uint32_t max, bool unbounded, std::string_view rule) {
    const Seq atom(seq.begin() + long(atom_start), seq.end());
    seq.resize(atom_start);
    for (uint32_t i = 0; i < min; ++i) seq.insert(seq.end(), atom.begin(), atom.end());
    if (unbounded) {
      seq.push_back({Op::kRule, star(atom, rule)});
    } else if (max > min) {
      // opt_k ::= atom opt_{k-1} | "" : at most max - min more.
      uint32_t inner = b_.fresh(rule, {atom, Seq{}});
      for (uint32_t k = 1; k < max - min; ++k) {
        Seq s = atom;
        s.push_back({Op::kRule, inner});
        inner = b_.fresh(rule, {std::move(s), Seq{}});
        check_size();
      }
      seq.push_back({Op::kRule, inner});
    }
    b_.elements += atom.size() * size_t(min);
    check_size();
  }

  void check_size() {
    if (b_.elements > kMaxGrammarElements)
      fail(pos_, "the grammar is too large (over " + std::to_string(kMaxGrammarElements) + " elements)");
  }

  Seq parse_sequence(std::string_view rule, bool nested) {
    Seq seq;
    size_t atom_start = SIZE_MAX;
    for (;;) {
      skip_space(nested);
      if (eof()) break;
      const char c = text_[pos_];
      const size_t here = pos_;
      if (c == '"') {
        ++pos_;
        atom_start = seq.size();
        std::string bytes;
        while (!eof() && text_[pos_] != '"') {
          if (text_[pos_] == '\n') fail(here, "unterminated string literal");
          append_utf8(bytes, parse_char());
        }
        if (eof()) fail(here, "unterminated string literal");
        ++pos_;
        for (char ch : bytes) seq.push_back(b_.byte(uint8_t(ch)));
        // An empty literal matches the empty string: nothing to repeat.
        if (bytes.empty()) atom_start = SIZE_MAX;
      } else if (c == '[') {
        ++pos_;
        const bool negate = !eof() && text_[pos_] == '^';
        if (negate) ++pos_;
        std::vector<Range> ranges;
        while (!eof() && text_[pos_] != ']') {
          if (text_[pos_] == '\n') fail(here, "unterminated character class");
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
            ++pos_;
            if (text_[pos_] == '\n') fail(here, "unterminated character class");
            hi = parse_char();
            if (hi < lo) fail(here, "character range out of order");
          }
          ranges.push_back({lo, hi});
        }
        if (eof()) fail(here, "unterminated character class");
        ++pos_;
        if (ranges.empty() && !negate) fail(here, "empty character class");
        atom_start = seq.size();
        seq.push_back(lower_class(std::move(ranges), negate, rule));
      } else if (c == '.') {
        ++pos_;
        atom_start = seq.size();
        seq.push_back(lower_class({}, true, rule));
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        std::vector<Seq> alts = parse_alternatives(rule, true);
        skip_space(true);
        if (eof() || text_[pos_] != ')') fail(here, "unclosed '('");
        ++pos_;
        atom_start = seq.size();
        seq.push_back({Op::kRule, b_.fresh(rule, std::move(alts))});
      } else if (name_char(c)) {
        const std::string_view name = parse_name();
        skip_space(nested);
        if (text_.substr(pos_, 3) == "::=") fail(here, "a new rule starts before this one ended (missing newline?)");
        atom_start = seq.size();
        seq.push_back({Op::kRule, b_.named(name, here)});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (atom_start == SIZE_MAX) fail(here, "'" + std::string(1, c) + "' with nothing before it to repeat");
        ++pos_;
        if (c == '*') {
          repeat(seq, atom_start, 0, 0, true, rule);
        } else if (c == '+') {
          repeat(seq, atom_start, 1, 0, true, rule);
        } else if (c == '?') {
          repeat(seq, atom_start, 0, 1, false, rule);
        } else {
          skip_space(nested);
          const uint32_t min = (!eof() && text_[pos_] == ',') ? 0 : parse_count();
          uint32_t max = min;
          bool unbounded = false;
          skip_space(nested);
          if (!eof() && text_[pos_] == ',') {
            ++pos_;
            skip_space(nested);
            if (!eof() && text_[pos_] == '}') unbounded = true;
            else max = parse_count();
          }
          skip_space(nested);
          if (eof() || text_[pos_] != '}') fail(here, "expected '}' to close the repetition");
          ++pos_;
          if (!unbounded && max < min) fail(here, "repetition {" + std::to_string(min) + "," + std::to_string(max) + "} has its maximum below its minimum");
          repeat(seq, atom_start, min, max, unbounded, rule);
        }
        atom_start = SIZE_MAX;  // "x**" is refused, as in llama.cpp
      } else {
        break;
      }
    }
    return seq;
  }

  std::vector<Seq> parse_alternatives(std::string_view rule, bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(rule, nested));
    for (;;) {
      skip_space(nested);
      if (eof() || text_[pos_] != '|') break;
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(rule, nested));
    }
    return alts;
  }

  std::string_view text_;
  std::string_view where_;
  Builder& b_;
  size_t pos_ = 0;
};

uint32_t add_min(uint32_t a, uint32_t b) { return (a == kNever || b == kNever) ? kNever : a + b; }

// Flattens the rules into code, then refuses left recursion (the matcher would expand it forever)
// and rules that can never end, and computes the fewest bytes to the end of each position.
Grammar finish(Builder& b, std::string_view where) {
  Grammar g;
  g.sets = std::move(b.sets);
  g.names = b.names;
  g.root = b.by_name.at("root");
  const size_t n = b.rules.size();
  g.alternatives.resize(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Seq& s : b.rules[r]) {
      g.alternatives[r].push_back(static_cast<uint32_t>(g.code.size()));
      g.code.insert(g.code.end(), s.begin(), s.end());
      g.code.push_back({Op::kEnd, 0});
    }
  }
  // Nullable rules, then the rules each one can reach without consuming a byte.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq& s : b.rules[r]) {
        if (std::all_of(s.begin(), s.end(), [&](const Element& e) { return e.op == Op::kRule && nullable[e.arg]; })) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;
  auto leading = [&](uint32_t r) {
    std::vector<uint32_t> out;
    for (const Seq& s : b.rules[r]) {
      for (const Element& e : s) {
        if (e.op != Op::kRule) break;
        out.push_back(e.arg);
        if (!nullable[e.arg]) break;
      }
    }
    return out;
  };
  for (uint32_t start = 0; start < n; ++start) {
    if (color[start] != 0) continue;
    std::vector<std::pair<uint32_t, std::vector<uint32_t>>> stack;
    stack.push_back({start, leading(start)});
    color[start] = 1;
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      if (next.empty()) {
        color[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t s = next.back();
      next.pop_back();
      if (color[s] == 1) throw Error(std::string(where) + ": left recursion through rule '" + g.names[s] + "' (it can reach itself before consuming any text)");
      if (color[s] == 0) {
        color[s] = 1;
        stack.push_back({s, leading(s)});
      }
    }
  }
  // Fewest bytes per rule (a fixpoint), then per position.
  g.rule_min.assign(n, kNever);
  auto seq_min = [&](const Seq& s) {
    uint32_t total = 0;
    for (const Element& e : s) total = add_min(total, e.op == Op::kBytes ? 1 : g.rule_min[e.arg]);
    return total;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      for (const Seq& s : b.rules[r]) {
        const uint32_t m = seq_min(s);
        if (m < g.rule_min[r]) {
          g.rule_min[r] = m;
          changed = true;
        }
      }
    }
  }
  std::vector<bool> reached(n, false);
  std::vector<uint32_t> todo{g.root};
  reached[g.root] = true;
  while (!todo.empty()) {
    const uint32_t r = todo.back();
    todo.pop_back();
    if (g.rule_min[r] == kNever)
      throw Error(std::string(where) + ": rule '" + g.names[r] + "' can never end (each alternative refers back to itself)");
    for (const Seq& s : b.rules[r])
      for (const Element& e : s)
        if (e.op == Op::kRule && !reached[e.arg]) {
          reached[e.arg] = true;
          todo.push_back(e.arg);
        }
  }
  g.min_bytes.assign(g.code.size(), 0);
  for (size_t i = g.code.size(); i-- > 0;) {
    const Element& e = g.code[i];
    if (e.op == Op::kEnd) continue;
    g.min_bytes[i] = add_min(e.op == Op::kBytes ? 1 : g.rule_min[e.arg], g.min_bytes[i + 1]);
  }
  return g;
}

}  // namespace

Grammar parse_gbnf(std::string_view text, std::string_view where) {
  Builder b;
  Parser parser(text, where, b);
  parser.parse();
  return finish(b, where);
}

}  // namespace tessera::grammar
