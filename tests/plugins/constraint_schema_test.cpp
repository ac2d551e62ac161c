// JSON Schema -> GBNF and regex -> GBNF (plugins/constraint_grammar): every real schema in
// shared/schemas converts or is refused naming a keyword; per feature, the grammar accepts valid
// instances and rejects invalid ones; python3-jsonschema independently agrees on which are valid.
#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "grammar.h"
#include "json_schema_gbnf.h"
#include "regex_gbnf.h"
#include "tessera/error.h"

namespace tessera::grammar {
namespace {

struct SchemaCase {
  const char* name;
  const char* schema;
  std::vector<std::string> valid;          // the grammar accepts; jsonschema says valid
  std::vector<std::string> invalid;        // the grammar rejects; jsonschema says invalid
  std::vector<std::string> not_generated;  // valid, but outside the compact subset the grammar makes
};

const std::vector<SchemaCase>& schema_cases() {
  static const std::vector<SchemaCase> cases = {
      {"required_and_optional",
       R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","tags"]})",
       {R"({"name":"a","tags":[]})", R"({"name":"\"x\"\n","age":-3,"tags":["b","c"]})"},
       {R"({"age":3,"tags":[]})", R"({"name":"a"})", R"({"name":1,"tags":[]})", R"({"name":"a","age":1.5,"tags":[]})"},
       {R"({"name": "a","tags":[]})", R"({"tags":[],"name":"a"})", R"({"name":"a","tags":[],"x":1})"}},
      {"additional_properties_schema",
       R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
       {"{}", R"({"id":1,"ok":true,"idx":false})", R"({"zz":false})"},
       {R"({"ok":1})", R"({"id":true})"},
       {}},
      {"additional_properties_false",
       R"({"type":"object","properties":{"a":{"const":1}},"additionalProperties":false})",
       {"{}", R"({"a":1})"},
       {R"({"a":2})", R"({"b":1})"},
       {}},
      {"enum_and_const",
       R"({"type":"object","properties":{"color":{"enum":["red","green",null,3]},"v":{"const":{"k":[1,"x"]}}},"required":["color"]})",
       {R"({"color":"red"})", R"({"color":null,"v":{"k":[1,"x"]}})", R"({"color":3})"},
       {R"({"color":"blue"})", R"({"color":"red","v":{"k":[1]}})"},
       {}},
      {"enum_filtered_by_type",
       R"({"type":"string","enum":["a","bb",1],"maxLength":1})",
       {R"("a")"},
       {R"("bb")", "1"},
       {}},
      {"array_bounds",
       R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":2,"maxItems":3})",
       {"[1,2]", "[0,9,5]"},
       {"[1]", "[1,2,3,4]", "[1,10]", "[-1,2]", "[]"},
       {"[1, 2]"}},
      {"tuple_prefix_items",
       R"({"type":"array","prefixItems":[{"type":"string"},{"type":"number"}],"items":false,"minItems":1})",
       {R"(["a"])", R"(["a",1.5])"},
       {"[]", R"([1])", R"(["a",1,2])"},
       {}},
      {"any_of_and_one_of",
       R"({"anyOf":[{"type":"string","maxLength":2},{"type":"integer","exclusiveMinimum":10}],"$comment":"x"})",
       {R"("ab")", "11", R"("")"},
       {R"("abc")", "10", "true"},
       {}},
      {"ref_recursion",
       R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"},
       {R"({"v":1,"kids":[{"kids":[]}]})", R"({"v":1,"kids":[{"v":"x"}]})"},
       {}},
      {"ref_root_recursion",
       R"({"type":"object","properties":{"next":{"$ref":"#"},"n":{"type":"null"}},"additionalProperties":false})",
       {"{}", R"({"next":{"next":{"n":null}}})"},
       {R"({"next":{"next":1}})"},
       {}},
      {"all_of_merge",
       R"({"definitions":{"base":{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}},"allOf":[{"$ref":"#/definitions/base"},{"properties":{"n":{"type":"integer","minimum":1}},"required":["n"]}]})",
       {R"({"id":"a","n":1})"},
       {R"({"id":"a"})", R"({"n":1})", R"({"id":"a","n":0})"},
       {}},
      {"string_lengths",
       R"({"type":"string","minLength":2,"maxLength":4})",
       {R"("ab")", R"("\u00e9\u00e9\u00e9\u00e9")", "\"\xc3\xa9\xc3\xa9\""},
       {R"("a")", R"("abcde")"},
       {}},
      {"pattern",
       R"({"type":"object","properties":{"phone":{"type":"string","pattern":"^\\d{3}-\\d{4}$"},"code":{"type":"string","pattern":"[A-Z]{2}"}}})",
       {R"({"phone":"555-1234"})", R"({"code":"xxAByy"})", R"({"code":"AB"})"},
       {R"({"phone":"5551234"})", R"({"phone":"555-12345"})", R"({"code":"ab"})"},
       {}},
      {"formats",
       R"({"type":"object","properties":{"t":{"type":"string","format":"date-time"},"d":{"type":"string","format":"date"},"u":{"type":"string","format":"uuid"},"e":{"type":"string","format":"email"},"ip":{"type":"string","format":"ipv4"}}})",
       {R"({"t":"2024-02-28T23:59:59.5+01:00","d":"2023-12-31"})", R"({"u":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"e":"jo.doe@example.com","ip":"192.168.0.255"})"},
       {R"({"t":"2024-13-01T00:00:00Z"})", R"({"d":"2023-02-30"})", R"({"t":"2024-01-01 10:00"})", R"({"ip":"256.1.1.1"})",
        R"({"u":"123e4567"})"},
       {}},
      {"integer_ranges",
       R"({"type":"array","prefixItems":[{"type":"integer","minimum":-20,"maximum":305},{"type":"integer","exclusiveMinimum":0},{"type":"integer","maximum":-7}],"items":false})",
       {"[-20,1,-7]", "[305,99999999999,-100]", "[0]", "[-9,1]"},
       {"[-21]", "[306]", "[1,0]", "[1,1,-6]", "[1.5]"},
       {"[-0]", "[1.0]"}},
      {"number_ranges",
       R"({"type":"array","prefixItems":[{"type":"number","minimum":0},{"type":"number","exclusiveMinimum":-1,"maximum":2}],"items":false})",
       {"[0]", "[0.5,2]", "[3,-0.5]", "[7,2.0]"},
       {"[-0.5]", "[1,-1]", "[1,2.01]"},
       {"[1e3]"}},  // bounded numbers are written without exponents
      {"nullable_type_array",
       R"({"type":["string","null"],"maxLength":1})",
       {"null", R"("a")"},
       {"1", R"("ab")"},
       {}},
      {"pattern_properties",
       R"({"type":"object","patternProperties":{"^S_":{"type":"string"},"^I_":{"type":"integer"}},"additionalProperties":false})",
       {"{}", R"({"S_a":"x","I_b":3})"},
       {R"({"S_a":1})", R"({"x":1})"},
       {}},
      {"draft4_exclusive_boolean",
       R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"integer","minimum":0,"exclusiveMinimum":true,"maximum":3})",
       {"1", "3"},
       {"0", "4"},
       {}},
  };
  return cases;
}

TEST(ConstraintSchema, FeaturesAcceptValidRejectInvalid) {
  for (const auto& c : schema_cases()) {
    SCOPED_TRACE(c.name);
    std::string text;
    ASSERT_NO_THROW(text = json_schema_text_to_gbnf(c.schema));
    Grammar g;
    ASSERT_NO_THROW(g = parse_gbnf(text, c.name)) << text;
    for (const auto& v : c.valid) EXPECT_TRUE(grammar_accepts(g, v)) << "valid: " << v << "\n" << text;
    for (const auto& v : c.invalid) EXPECT_FALSE(grammar_accepts(g, v)) << "invalid: " << v << "\n" << text;
    for (const auto& v : c.not_generated) EXPECT_FALSE(grammar_accepts(g, v)) << "not compact: " << v << "\n" << text;
  }
}

// The table's verdicts come from python3-jsonschema, not from this converter's reading of the spec.
TEST(ConstraintSchema, OracleAgreesOnTheInstances) {
  if (std::system("/usr/bin/python3 -c 'import jsonschema' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-jsonschema is not installed";
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : schema_cases()) {
    std::vector<std::string> valid = c.valid;
    valid.insert(valid.end(), c.not_generated.begin(), c.not_generated.end());
    cases.push_back({{"schema", nlohmann::json::parse(c.schema)}, {"valid", valid}, {"invalid", c.invalid}});
  }
  const auto path = std::filesystem::temp_directory_path() / ("schema_cases_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << cases.dump();
  const std::string cmd = "/usr/bin/python3 " TESSERA_SOURCE_DIR "/tests/reference/check_schema_instances.py " + path.string();
  const int rc = std::system(cmd.c_str());
  std::filesystem::remove(path);
  EXPECT_EQ(rc, 0) << "jsonschema disagrees with the table (see the lines above)";
}

TEST(ConstraintSchema, SharedSchemasConvertOrNameWhatIsRefused) {
  const std::filesystem::path dir = std::filesystem::path(TESSERA_SHARED_DIR) / "schemas";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is missing";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  size_t converted = 0;
  for (const auto& p : files) {
    std::ifstream in(p);
    std::stringstream text;
    text << in.rdbuf();
    try {
      const std::string gbnf = json_schema_text_to_gbnf(text.str());
      ASSERT_NO_THROW(parse_gbnf(gbnf, p.filename().string())) << p << " gave GBNF the parser refuses";
      ++converted;
    } catch (const Error& e) {
      const std::string what = e.what();
      std::printf("refused %s: %s\n", p.filename().c_str(), what.c_str());
      // A refusal names what it refuses ('keyword' or 'format') and where.
      EXPECT_EQ(what.rfind("json_schema: ", 0), 0u) << what;
      EXPECT_NE(what.find(" at /"), std::string::npos) << what;
      EXPECT_NE(what.find('\''), std::string::npos) << what;
    }
  }
  std::printf("JSON Schema coverage: %zu/%zu converted\n", converted, files.size());
  // Measured 101/112 when this test was written; a drop means a regression.
  EXPECT_GE(converted, 101u);
}

TEST(ConstraintSchema, RefusalsNameKeywordAndPointer) {
  auto message = [](const char* schema, const JsonSchemaOptions& o = {}) -> std::string {
    try {
      json_schema_text_to_gbnf(schema, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "(converted)";
  };
  EXPECT_EQ(message(R"({"type":"object","properties":{"tags":{"not":{"type":"string"}}}})"),
            "json_schema: unsupported keyword 'not' at /properties/tags");
  EXPECT_EQ(message(R"({"type":"number","multipleOf":0.5})"), "json_schema: unsupported keyword 'multipleOf' at /");
  EXPECT_EQ(message(R"({"type":"array","uniqueItems":true})"), "json_schema: unsupported keyword 'uniqueItems' at /");
  EXPECT_EQ(message(R"({"properties":{"p":{"type":"string","format":"slug"}}})"),
            "json_schema: unsupported format 'slug' at /properties/p");
  EXPECT_NE(message(R"({"$ref":"#/definitions/missing"})").find("cannot resolve $ref '#/definitions/missing'"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"https://example.com/s.json"})").find("unsupported $ref"), std::string::npos);
  EXPECT_NE(message(R"({"type":"strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":"(?=a)b"})").find("lookahead"), std::string::npos);
  EXPECT_EQ(message(R"({"type":"string","maxLenght":3})"), "(converted)");
  EXPECT_EQ(message(R"({"type":"string","maxLenght":3})", {.refuse_unknown_keywords = true}),
            "json_schema: unknown keyword 'maxLenght' at /");
}

// $ref is a JSON Pointer in a URI fragment: ~0 ~1 and %HH escapes resolve; a malformed escape or an
// index no array has is a clear refusal (a fuzzer found "%sj" and long digit strings threw std:: errors).
TEST(ConstraintSchema, RefPointersResolveEscapesAndRefuseBadSteps) {
  auto grammar_of = [](const std::string& schema) { return parse_gbnf(json_schema_text_to_gbnf(schema, {}), "schema"); };
  const Grammar escaped = grammar_of(R"({"$defs":{"a/b":{"const":1},"c~d":{"const":2},"e f":{"const":3}},
      "type":"array","prefixItems":[{"$ref":"#/$defs/a~1b"},{"$ref":"#/$defs/c~0d"},{"$ref":"#/$defs/e%20f"}],
      "items":false,"minItems":3})");
  EXPECT_TRUE(grammar_accepts(escaped, "[1,2,3]"));
  EXPECT_FALSE(grammar_accepts(escaped, "[1,2,2]"));
  const Grammar indexed = grammar_of(R"({"anyOf":[{"const":"x"},{"$ref":"#/anyOf/0"}]})");
  EXPECT_TRUE(grammar_accepts(indexed, R"("x")"));
  for (const char* ref : {"#/$defs/a%sj", "#/$defs/a%", "#/anyOf/99999999999999999999999", "#/anyOf/-1",
                          "#/anyOf/01", "#/$defs/a/b"}) {
    const std::string schema = std::string(R"({"$defs":{"a":{"const":1}},"anyOf":[{"const":1},{"$ref":")") + ref + R"("}]})";
    try {
      json_schema_text_to_gbnf(schema, {});
      ADD_FAILURE() << ref << " resolved";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("cannot resolve $ref '") + ref + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ConstraintSchema, JsonObjectModeAcceptsAnyCompactObject) {
  const Grammar g = parse_gbnf(json_object_gbnf(), "json_object");
  for (const char* ok : {"{}", R"({"a":[1,{"b":null}],"c":"\u00e9\n"})", R"({"x":-0.5e+3,"y":true})"})
    EXPECT_TRUE(grammar_accepts(g, ok)) << ok;
  for (const char* bad : {"[]", R"({"a":1,})", R"({ "a":1})", R"({"a":01})", "{\"a\":\"\x01\"}"})
    EXPECT_FALSE(grammar_accepts(g, bad)) << bad;
}

struct RegexCase {
  const char* pattern;
  std::vector<std::string> match;
  std::vector<std::string> no_match;
};

TEST(ConstraintRegex, WholeMatchTables) {
  const std::vector<RegexCase> cases = {
      {R"(\d{3}-\d{4})", {"555-1234", "000-0000"}, {"5551234", "555-123", "a55-1234", "555-12345"}},
      {"[A-Z][a-z]+", {"Hello", "Ab"}, {"A", "hello", "HeLlo"}},
      {"(a|bc)*d", {"d", "abcd", "bcbcaad"}, {"", "abc", "bd d", "cd"}},
      {"[\\u00e0-\\u00ff]+\\.?", {"\xc3\xa9\xc3\xa0", "\xc3\xbf."}, {"e", "\xc4\x80"}},
      {"[^a-c\\s]{2,}", {"dd", "\xe2\x82\xac!"}, {"d", "da", "d "}},
      {"^(?:x|y)+?z$", {"xz", "yxz"}, {"z", "xy"}},
      {"a.c", {"abc", "a\xe2\x82\xac" "c"}, {"a\nc", "ac"}},
      {"\\w+@\\w+\\.com", {"jo_1@ex.com"}, {"jo@ex.org", "@ex.com"}},
      {"colou?r|gr[ae]y", {"color", "colour", "gray", "grey"}, {"colouur", "grby"}},
      {"(ab){2}c{1,2}", {"ababc", "ababcc"}, {"abc", "ababccc"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pattern);
    const std::string text = regex_to_gbnf(c.pattern, "root", true);
    Grammar g;
    ASSERT_NO_THROW(g = parse_gbnf(text, c.pattern)) << text;
    for (const auto& s : c.match) EXPECT_TRUE(grammar_accepts(g, s)) << s << "\n" << text;
    for (const auto& s : c.no_match) EXPECT_FALSE(grammar_accepts(g, s)) << s << "\n" << text;
  }
}

TEST(ConstraintRegex, UnanchoredSidesTakeAnyText) {
  const Grammar g = parse_gbnf(regex_to_gbnf("ab$", "root", false), "regex");
  EXPECT_TRUE(grammar_accepts(g, "xxab"));
  EXPECT_TRUE(grammar_accepts(g, "ab"));
  EXPECT_FALSE(grammar_accepts(g, "abx"));
  const std::string text = regex_to_gbnf("b", "pat", false);
  EXPECT_EQ(text.rfind("pat ::= ", 0), 0u) << text;
  EXPECT_TRUE(grammar_accepts(parse_gbnf("root ::= pat\n" + text, "regex"), "a\nbc"));
}

TEST(ConstraintRegex, RefusesWhatAGrammarCannotHonour) {
  auto message = [](const char* pattern) -> std::string {
    try {
      regex_to_gbnf(pattern, "root", true);
    } catch (const Error& e) {
      return e.what();
    }
    return "(converted)";
  };
  EXPECT_NE(message("a(?=b)").find("lookahead (?=...) at position 1"), std::string::npos) << message("a(?=b)");
  EXPECT_NE(message("(?<!a)b").find("lookbehind"), std::string::npos);
  EXPECT_NE(message("(a)\\1").find("backreference \\1 at position 3"), std::string::npos) << message("(a)\\1");
  EXPECT_NE(message("a\\bc").find("word boundary"), std::string::npos);
  EXPECT_NE(message("a^b").find("anchor '^'"), std::string::npos);
  EXPECT_NE(message("a$b").find("anchor '$'"), std::string::npos);
  EXPECT_NE(message("\\p{L}").find("Unicode property"), std::string::npos);
  EXPECT_NE(message("(ab").find("unterminated group"), std::string::npos);
  EXPECT_NE(message("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(message("a{3,1}").find("n > m"), std::string::npos);
}

}  // namespace
}  // namespace tessera::grammar
