// The grammar constraint's GBNF parser and byte-level matcher (plugins/constraint_grammar): what a
// grammar accepts, UTF-8 classes, repetition bounds, and the refusals a user sees (line:column,
// undefined and left-recursive rules, rules that never end, sizes past the limits).
#include <gtest/gtest.h>

#include <string>

#include "grammar.h"
#include "grammar_matcher.h"
#include "tessera/error.h"

namespace tessera::grammar {
namespace {

struct Case {
  const char* text;
  bool ok;
};

void expect_accepts(const std::string& gbnf, std::initializer_list<Case> cases) {
  const Grammar g = parse_gbnf(gbnf, "test.gbnf");
  for (const Case& c : cases)
    EXPECT_EQ(grammar_accepts(g, c.text), c.ok) << "grammar:\n" << gbnf << "\ninput: '" << c.text << "'";
}

std::string error_of(const std::string& gbnf) {
  try {
    parse_gbnf(gbnf, "g.gbnf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GbnfGrammar, LiteralsAlternativesGroupsAndRepetition) {
  expect_accepts(R"(root ::= "a" ("b" | "cd")* "e"?   # trailing comment
)",
                 {{"a", true}, {"ab", true}, {"acdbe", true}, {"ae", true}, {"aee", false}, {"", false}, {"ac", false}});
  expect_accepts("root ::= [0-9]+ (\".\" [0-9]{2,3})?\n",
                 {{"7", true}, {"12.50", true}, {"1.234", true}, {"1.2", false}, {"1.2345", false}, {".12", false}});
  expect_accepts("root ::= \"x\"{3}\n", {{"xxx", true}, {"xx", false}, {"xxxx", false}});
  expect_accepts("root ::= \"x\"{,2}\n", {{"", true}, {"xx", true}, {"xxx", false}});
  expect_accepts("root ::= \"ab\"{2,}\n", {{"abab", true}, {"ababab", true}, {"ab", false}, {"aba", false}});
  expect_accepts("root ::= item (\",\" item)*\nitem ::= [a-z]+\n",
                 {{"a,bc,def", true}, {"a,", false}, {",a", false}});
  // Alternatives continue on the next line after '|' and inside parentheses.
  expect_accepts("root ::= \"a\" |\n  \"b\"\nother ::= (\n  \"c\"\n  \"d\")\n", {{"a", true}, {"b", true}, {"cd", false}});
}

TEST(GbnfGrammar, EscapesAndNegatedClasses) {
  expect_accepts(R"(root ::= "\"" [^"\\\n]* "\"" "\t" "\x41" "\u00e9"
)",
                 {{"\"hi there\"\tA\xC3\xA9", true}, {"\"a\"b\"\tA\xC3\xA9", false}, {"\"a\nb\"\tA\xC3\xA9", false}});
  expect_accepts(R"(root ::= [\]\-a]+
)", {{"]-a", true}, {"b", false}});
}

TEST(GbnfGrammar, ClassesOverCodePointsMatchTheirUtf8Bytes) {
  // é (2 bytes), € (3 bytes), 😀 (4 bytes), and a range that crosses the encodings' boundaries.
  expect_accepts("root ::= [\\u0080-\\U0001F600]\n", {{"\xC2\x80", true},
                                                      {"\xC3\xA9", true},
                                                      {"\xE2\x82\xAC", true},
                                                      {"\xF0\x9F\x98\x80", true},
                                                      {"\xF0\x9F\x98\x81", false},
                                                      {"a", false},
                                                      {"\xC3", false},
                                                      {"\xED\xA0\x80", false}});  // a surrogate's bytes
  expect_accepts("root ::= [^a]\n", {{"b", true}, {"a", false}, {"\xE2\x82\xAC", true}, {"\xF4\x8F\xBF\xBF", true}, {"\xF4\x90\x80\x80", false}});
  expect_accepts("root ::= .+\n", {{"a\xC3\xA9\xE2\x82\xAC", true}, {"\xC3", false}, {"\xFF", false}});
  expect_accepts("root ::= \"é\" [α-ω]\n", {{"\xC3\xA9\xCE\xB2", true}, {"\xC3\xA9z", false}});
}

TEST(GbnfGrammar, RecursionThroughRulesIsMatched) {
  expect_accepts("root ::= value\nvalue ::= \"[\" (value (\",\" value)*)? \"]\" | \"0\"\n",
                 {{"[]", true}, {"[0,[0,[]],0]", true}, {"[[[[[[0]]]]]]", true}, {"[0,]", false}, {"[[0]", false}});
}

TEST(GbnfGrammar, LongRepetitionKeepsTheStackFlat) {
  const Grammar g = parse_gbnf("root ::= \"a\"*\n", "t");
  Stacks stacks(g);
  std::vector<int32_t> tops, next;
  stacks.start(tops);
  for (int i = 0; i < 10000; ++i) {
    stacks.advance(tops, 'a', next);
    ASSERT_FALSE(next.empty());
    tops.swap(next);
  }
  std::string key;
  stacks.key(tops, key);
  std::vector<int32_t> first;
  Stacks fresh(g);
  fresh.start(first);
  std::string start_key;
  fresh.key(first, start_key);
  EXPECT_EQ(key, start_key) << "a repetition returns to the same state (the mask cache relies on it)";
}

TEST(GbnfGrammar, DistanceIsTheFewestBytesToAnEnd) {
  const Grammar g = parse_gbnf("root ::= \"{\" pair (\",\" pair)* \"}\"\npair ::= \"\\\"\" [a-z]+ \"\\\":\" [0-9]\n", "t");
  Stacks stacks(g);
  std::vector<int32_t> tops, next;
  stacks.start(tops);
  EXPECT_EQ(stacks.distance(tops), std::string(R"({"a":0})").size());
  for (char c : std::string(R"({"ab)")) {
    stacks.advance(tops, uint8_t(c), next);
    tops.swap(next);
  }
  EXPECT_EQ(stacks.distance(tops), std::string(R"(":0})").size());
}

TEST(GbnfGrammar, RefusalsNameTheLineColumnAndProblem) {
  EXPECT_NE(error_of("root ::= \"a\"\nfoo ::= bar\n").find("g.gbnf:2:9: rule 'bar' is used but not defined"),
            std::string::npos)
      << error_of("root ::= \"a\"\nfoo ::= bar\n");
  EXPECT_NE(error_of("foo ::= \"a\"\n").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\n").find("g.gbnf:1:10: unterminated string literal"), std::string::npos)
      << error_of("root ::= \"a\n");
  EXPECT_NE(error_of("root ::= [a-\n").find("unterminated character class"), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]\n").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"\n").find("unknown escape '\\q'"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"\n").find("unclosed '('"), std::string::npos);
  EXPECT_NE(error_of("root ::= * \"a\"\n").find("nothing before it"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,1}\n").find("maximum below its minimum"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{99999}\n").find("over the limit of 10000"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"\n").find("g.gbnf:2:1: rule 'root' is defined twice"), std::string::npos);
  EXPECT_NE(error_of("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n").find("left recursion through rule 'expr'"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= a\na ::= b? a\nb ::= \"x\"\n").find("left recursion"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"[\" root \"]\"\n").find("rule 'root' can never end"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\xFF\"\n").find("invalid UTF-8"), std::string::npos);
  // A repeated literal is copied: a client's grammar is refused by size, not by running out of memory.
  EXPECT_NE(error_of("root ::= \"" + std::string(300, 'a') + "\"{10000}\n").find("too large"), std::string::npos);
}

}  // namespace
}  // namespace tessera::grammar
