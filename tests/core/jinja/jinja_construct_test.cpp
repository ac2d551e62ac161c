// Jinja constructs one at a time: each case has the output Jinja2 gives (checked here without
// Python, and against Jinja2 itself when /usr/bin/python3 has it), and the errors name the line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/jinja/jinja_oracle.h"
#include "tessera/chat_template.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using nlohmann::ordered_json;

struct Case {
  const char* source;
  const char* context;  // JSON object
  const char* expected;
};

// Expected outputs are what Jinja2 3.1 prints with transformers' settings.
const std::vector<Case> kCases = {
    // whitespace: trim_blocks, lstrip_blocks, - on either side, the last newline of the source
    {"{% if true %}\n  yes\n{% endif %}\n", "{}", "  yes\n"},
    {"  {% if true %}\nA\n  {% endif %}\nB\n", "{}", "A\nB"},
    {"a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc"},
    {"x {{- ' y ' -}} z", "{}", "x y z"},
    {"a\n  {{ 'v' }}\n  {# note #}\nb", "{}", "a\n  v\nb"},
    {"a {%+ if true %}b{% endif %}", "{}", "a b"},
    {"{% raw %}{{ not evaluated }}{% endraw %}", "{}", "{{ not evaluated }}"},
    {"line1\r\nline2\r\n", "{}", "line1\nline2"},
    // literals and printing Python values
    {"{{ 1.0 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1e20 }} {{ 0.1 + 0.2 }}", "{}",
     "1.0 2.5 3 2 1024 1e+20 0.30000000000000004"},
    {"{{ none }} {{ true }} {{ False }} {{ [1, 'a', none] }} {{ {'k': [true]} }} {{ ('a',) }}", "{}",
     "None True False [1, 'a', None] {'k': [True]} ('a',)"},
    {"{{ \"it's\" }} {{ ['it\\'s', 'say \"hi\"'] }} {{ 'tab\\tnl\\n' ~ '\\u00e9\\x41' }}", "{}",
     "it's [\"it's\", 'say \"hi\"'] tab\tnl\néA"},
    {"{{ 'a' 'b' }}{{ 'x' ~ 1 ~ none }}{{ 'ab' * 3 }}{{ [1] + [2] }}", "{}", "abx1Noneababab[1, 2]"},
    // undefined
    {"[{{ missing }}][{{ missing | default('d') }}][{{ missing is defined }}][{% for x in missing %}x{% endfor %}]",
     "{}", "[][d][False][]"},
    {"{{ d.nokey is defined }} {{ d['nokey'] | default('z') }} {{ d.get('nokey') }} {{ d.get('nokey', 5) }}",
     R"({"d": {"k": 1}})", "False z None 5"},
    // if / elif / else, ternary, boolean operators return operands
    {"{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}", R"({"x": 2})", "two"},
    {"{{ 'y' if x else 'n' }}{{ 'y' if not x }}|{{ x or 'fallback' }}|{{ x and 'both' }}", R"({"x": 0})",
     "ny|fallback|0"},
    // comparisons, in, is
    {"{{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }} {{ 'a' != 'a' }}",
     "{}", "True True True True True False"},
    {"{{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 'x' is string }} {{ {} is mapping }} "
     "{{ 'x' is iterable }} {{ none is none }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 2 is not even }}",
     "{}", "True True False True True True True True True False"},
    // for: loop variables, else, filtering, unpacking, break/continue
    {"{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}", R"({"xs": [5, 6, 7]})",
     "1/3,2/3,3/3"},
    {"{% for x in xs %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{% else %}empty{% endfor %}", R"({"xs": []})",
     "empty"},
    {"{% for x in xs if x is odd %}{{ x }}{{ loop.length }} {% endfor %}", R"({"xs": [1, 2, 3, 4, 5]})", "13 33 53 "},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}",
     R"({"d": {"z": 1, "a": 2}})", "z=1;a=2;za"},
    {"{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     R"({"xs": [1, 2, 3, 4, 5]})", "13"},
    {"{% for m in ms %}{{ loop.previtem is defined }}-{{ loop.nextitem | default('end') }} {% endfor %}",
     R"({"ms": ["a", "b"]})", "False-b True-end "},
    {"{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.cycle('!', '?') }}{% endfor %}{% endfor %}", "{}",
     "1x!1y?2x!2y?"},
    // scoping: set in a loop does not leak, namespace does, if does not scope
    {"{% set n = 0 %}{% for x in [1, 2] %}{% set n = n + x %}{% endfor %}{{ n }}", "{}", "0"},
    {"{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", "{}", "3"},
    {"{% if true %}{% set y = 'set' %}{% endif %}{{ y }}", "{}", "set"},
    {"{% set a, b = [1, 2] %}{{ b }}{{ a }}{% set t %}block {{ a }}{% endset %}[{{ t }}]", "{}", "21[block 1]"},
    {"{% set s | upper %}shout{% endset %}{{ s }}{% filter trim %}  padded  {% endfilter %}", "{}", "SHOUTpadded"},
    // macros, call blocks
    {"{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} "
     "{{ greet('Bob', greeting='Hi') }}",
     "{}", "Hello, Ann! Hi, Bob!"},
    {"{% macro f() %}{{ z }}{% endmacro %}{% set z = 3 %}{{ f() }}{% set z = 4 %}{{ f() }}", "{}", "34"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "{}", "120"},
    {"{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside{% endcall %}", "{}", "<inside>"},
    // filters
    {"{{ '  x  ' | trim }}|{{ 'ab' | upper }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|"
     "{{ 'a-b' | replace('-', '+') }}|{{ [1, 2] | join(', ') }}|{{ 'abc' | length }}|{{ {'a': 1} | count }}",
     "{}", "x|AB|Hello World|Hello|a+b|1, 2|3|1"},
    {"{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | unique | list }} {{ [1, 2, 3] | reverse | list }} "
     "{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }} {{ 'abc' | list }} {{ [1, 2, 3, 4, 5] | batch(2) | list }}",
     "{}", "[1, 2, 3] ['b', 'A'] [3, 2, 1] 13 ['a', 'b', 'c'] [[1, 2], [3, 4], [5]]"},
    {"{{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ '2.5' | float }} {{ 2.567 | round(2) }} "
     "{{ 2.5 | round }} {{ -3 | abs }} {{ 'one two  three' | wordcount }} {{ 1 | string ~ 'x' }}",
     "{}", "43 4 7 2.5 2.57 2.0 3 3 1x"},
    {"{{ users | selectattr('admin') | map(attribute='name') | join(',') }} "
     "{{ users | rejectattr('admin') | map(attribute='name') | list }} "
     "{{ users | selectattr('name', 'equalto', 'b') | list | length }} {{ [1, 2, 3, 4] | select('even') | list }} "
     "{{ ['a', 'B'] | map('upper') | list }} {{ users | map(attribute='age', default=0) | list }}",
     R"({"users": [{"name": "a", "admin": true, "age": 3}, {"name": "b", "admin": false}]})",
     "a ['b'] 1 [2, 4] ['A', 'B'] [3, 0]"},
    {"{{ d | dictsort }} {{ users | sort(attribute='n') | map(attribute='n') | join }} {{ [1, 5, 2] | max }}"
     "{{ [1, 5, 2] | min }}{{ [1, 2, 3] | sum }}",
     R"({"d": {"b": 1, "a": 2}, "users": [{"n": "y"}, {"n": "x"}]})", "[('a', 2), ('b', 1)] xy 516"},
    // map, select... give generators in Jinja2: always true, and neither len() nor JSON takes them
    {"{% if [] | select('odd') %}gen{% endif %}{% if [] | select('odd') | list %}list{% endif %}"
     "{{ none | selectattr('x') | list }}{{ {'a': 1}.items() | list }}",
     "{}", "gen[][('a', 1)]"},
    {"{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é<>&\"' | tojson }}|{{ [] | tojson(indent=4) }}|{{ 1.5 | tojson }}",
     R"({"d": {"z": [1, {"y": null}], "a": true}})",
     "{\"z\": [1, {\"y\": null}], \"a\": true}|{\n  \"z\": [\n    1,\n    {\n      \"y\": null\n    }\n  ],\n  \"a\": true\n}|"
     "\"é<>&\\\"\"|[]|1.5"},
    {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, first=true) }}|{{ 'x' | center(5) }}|", "{}",
     "a\n  b\n\n  c|  a\n  b|  x  |"},
    {"{{ 'Tom' | safe + ' & Jerry' }}|{{ '<b>' | escape }}|{{ '%s is %d' | format('x', 3) }}", "{}",
     "Tom &amp; Jerry|&lt;b&gt;|x is 3"},
    // slicing, indexing, methods
    {"{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[-1] }} {{ 'héllo'[1:3] }} {{ 'abc'[::2] }} {{ xs.0 }}",
     R"({"xs": [1, 2, 3]})", "[2, 3] [1, 2] [3, 2, 1] 3 él ac 1"},
    {"{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'x</think>y'.split('</think>')[-1] }}|"
     "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|"
     "{{ 'aaa'.replace('a', 'b', 2) }}|{{ '{} and {}'.format(1, 'x') }}|{{ 'xxhixx'.strip('x') }}|{{ 'a b'.title() }}",
     "{}", "a b|['a', 'b', '', 'c']|['a', 'b']|y|TrueTrue|HIhi|bba|1 and x|hi|A B"},
    {"{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d['k'] }} {{ d.k }}",
     R"({"d": {"k": 1, "j": 2}})", "['k', 'j'] [1, 2] [('k', 1), ('j', 2)] 1 1"},
    // a dict's `items` attribute is its method, as in Python (JSON schemas have "items" keys)
    {"{{ s.items is defined }} {{ s['items'] }} {{ s.type }}", R"({"s": {"type": "array", "items": {"type": "string"}}})",
     "True {'type': 'string'} array"},
    // globals
    {"{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1) }} {{ namespace(a=1).a }} "
     "{{ strftime_now('%d %b %Y') }}",
     "{}", "[0, 1, 2] [1, 3, 5] {'a': 1} 1 26 Jul 2024"},
    {"{% generation %}assistant text{% endgeneration %}", "{}", "assistant text"},
};

TEST(JinjaConstructs, RenderAsJinja2) {
  JinjaRenderOptions opts;
  opts.now = test::kFixedNow;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.source);
    const ordered_json ctx = ordered_json::parse(c.context);
    std::string got;
    try {
      got = JinjaTemplate::parse(c.source, "case").render(ctx, opts);
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected);
  }
}

TEST(JinjaConstructs, TheExpectationsAreJinja2s) {
  if (!test::jinja2_available()) GTEST_SKIP() << "/usr/bin/python3 has no jinja2 (Debian: python3-jinja2): no oracle";
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.source);
    const test::OracleResult r = test::jinja2_render(c.source, ordered_json::parse(c.context));
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output, c.expected);
  }
}

// Jinja2 raises for these; so must we, naming the line.
TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  struct Bad {
    const char* source;
    const char* needle;
  };
  const std::vector<Bad> bad = {
      {"line one\n{{ missing.attr }}", "line 2: 'missing' is undefined"},
      {"\n\n{{ d.a.b }}", "line 3: 'dict object' has no attribute 'a'"},
      {"{{ 1 + 'a' }}", "line 1: unsupported operand type(s) for +"},
      {"{{ 'x' + missing }}", "'missing' is undefined"},
      {"{% for m in messages %}\n{{ raise_exception('Roles must alternate') }}\n{% endfor %}",
       "line 2: the template raised an exception: Roles must alternate"},
      {"{{ [1] | no_such_filter }}", "unknown filter 'no_such_filter'"},
      {"{{ 1 is no_such_test }}", "unknown test 'no_such_test'"},
      {"{{ none | tojson }}{{ missing | tojson }}", "not JSON serializable"},
      {"{% for x in 5 %}{% endfor %}", "is not iterable"},
      {"{% set x = 1 %}{% set x.a = 2 %}", "namespace"},
      {"{{ [1, 2] | select('odd') | length }}", "has no len()"},
      {"{{ [{'a': 1}] | map(attribute='a') | tojson }}", "not JSON serializable"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.source);
    const ordered_json ctx = ordered_json::parse(R"({"messages": [{"role": "user"}], "d": {}})");
    try {
      JinjaTemplate::parse(b.source, "bad").render(ctx);
      ADD_FAILURE() << "rendered without an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("template 'bad'"), std::string::npos) << e.what();
    }
    if (test::jinja2_available()) EXPECT_FALSE(test::jinja2_render(b.source, ctx).ok) << "Jinja2 renders it";
  }
}

TEST(JinjaErrors, SyntaxErrorsNameTheConstructAndLine) {
  struct Bad {
    const char* source;
    const char* needle;
  };
  const std::vector<Bad> bad = {
      {"ok\n{% if x %}\nno end", "line 3: unexpected end of template, expected 'elif' or 'else' or 'endif'"},
      {"{% for x in xs %}\n{% endif %}", "line 2: unknown tag 'endif'"},
      {"\n{{ x + }}", "line 2: unexpected end of print statement '}}', expected an expression"},
      {"{% include 'other.jinja' %}", "line 1: the {% include %} tag is not supported"},
      {"{{ 'unterminated }}", "line 1: unexpected end of template inside a string literal"},
      {"{# never closed", "line 1: missing end of comment tag"},
      {"{{ (1, 2] }}", "line 1: unexpected ']', expected ')'"},
      {"{% frobnicate %}", "line 1: unknown tag 'frobnicate'"},
      {"{% for x in xs recursive %}{% endfor %}", "recursive for loops are not supported"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.source);
    try {
      JinjaTemplate::parse(b.source, "broken");
      ADD_FAILURE() << "parsed without an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("template 'broken'"), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplateApi, PassesTheVariablesTransformersPasses) {
  const JinjaTemplate t = JinjaTemplate::parse(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}{{ tools is defined }}{{ date_string }}",
      "api");
  ChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  in.bos_token = "<s>";
  in.extra["date_string"] = "today";
  EXPECT_EQ(render_chat_template(t, in), "<s><user>Hi<assistant>Falsetoday");
  in.add_generation_prompt = false;
  in.tools = ordered_json::array();
  EXPECT_EQ(render_chat_template(t, in), "<s><user>HiTruetoday");
  EXPECT_EQ(t.name(), "api");
}

}  // namespace
}  // namespace tessera
