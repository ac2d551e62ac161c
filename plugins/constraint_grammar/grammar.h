// A context-free grammar over bytes: what GBNF text (and JSON Schemas and regular expressions,
// through their GBNF) compiles to, and what the matcher runs. Code points are lowered to their UTF-8
// byte sequences when parsed, so matching and token masks work on the vocabulary's raw bytes, and a
// token that ends inside a multi-byte character is handled like any other.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::grammar {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1u; }
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet&) const = default;
};

// Each rule's alternatives are sequences of elements in `code`, each ending with kEnd.
enum class Op : uint8_t { kBytes, kRule, kEnd };
struct Element {
  Op op = Op::kEnd;
  uint32_t arg = 0;  // kBytes: index into sets; kRule: rule index
};

inline constexpr uint32_t kNever = UINT32_MAX;  // a rule that cannot finish (refused when compiled)

struct Grammar {
  std::vector<Element> code;
  std::vector<ByteSet> sets;
  std::vector<std::vector<uint32_t>> alternatives;  // per rule: where each alternative starts in code
  std::vector<std::string> names;                   // per rule; generated ones are "parent-N"
  uint32_t root = 0;
  // Fewest bytes from each position to the end of its alternative, and per rule: how far a
  // sequence is from a complete output (the budget-aware mask uses them).
  std::vector<uint32_t> min_bytes;
  std::vector<uint32_t> rule_min;
};

// Limits that keep a client's grammar (or a schema's repetition counts) from taking unbounded memory.
inline constexpr size_t kMaxGrammarElements = 2'000'000;
inline constexpr uint32_t kMaxRepetition = 10'000;

// Parses llama.cpp's GBNF dialect: `name ::= alternatives`, "literals", [classes], ., ( ), | and the
// postfix operators * + ? {n} {n,} {n,m} {,m}, # comments; `root` is the start. Throws
// tessera::Error "where:line:column: problem" for syntax errors, undefined rules, left recursion and
// rules that can never end.
Grammar parse_gbnf(std::string_view text, std::string_view where);

// True when the whole of `bytes` is a sentence of the grammar (tests, and the compile-time checks).
bool grammar_accepts(const Grammar& g, std::string_view bytes);

}  // namespace tessera::grammar
