// Every real chat template in ../shared/templates, rendered for a set of conversations by tessera's
// interpreter and by Jinja2 (as transformers calls it): the bytes must be identical, and where
// Jinja2 raises (a role the template refuses, a missing variable) tessera must raise too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/jinja/jinja_oracle.h"
#include "tessera/chat_template.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

// TESSERA_CHAT_TEMPLATES_DIR points the comparison at another folder of .jinja files.
const fs::path kTemplates = std::getenv("TESSERA_CHAT_TEMPLATES_DIR") != nullptr
                                ? fs::path(std::getenv("TESSERA_CHAT_TEMPLATES_DIR"))
                                : fs::path(TESSERA_SHARED_DIR) / "templates";

ordered_json j(const char* text) { return ordered_json::parse(text); }

// Two tools whose parameters nest: an object inside an object, an array with items, a union type,
// an enum, defaults (an int and a float), bounds, and text that JSON must escape.
const char* const kTools = R"JSON([
  {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
      "location": {"type": "string", "description": "City and country, e.g. \"Paris, France\""},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
      "days": {"type": "integer", "description": "Forecast days", "minimum": 1, "maximum": 7, "default": 1}},
     "required": ["location"]}}},
  {"type": "function", "function": {"name": "search_flights", "description": "Search flights between two airports (fares < 1000 & direct only?)",
    "parameters": {"type": "object", "properties": {
      "route": {"type": "object", "description": "Where to fly", "properties": {
        "from": {"type": "string", "description": "IATA code of the origin"},
        "to": {"type": "string", "description": "IATA code of the destination"}}, "required": ["from", "to"]},
      "passengers": {"type": "array", "description": "Passenger names", "items": {"type": "string"}},
      "max_price": {"type": ["number", "null"], "description": "Highest fare in EUR", "default": 99.5},
      "nonstop": {"type": "boolean", "description": "Only direct flights"}},
     "required": ["route"]}}}
])JSON";

struct Conversation {
  const char* name;
  ordered_json context;
};

ordered_json base(ordered_json messages, bool add_generation_prompt) {
  ordered_json c = ordered_json::object();
  c["messages"] = std::move(messages);
  c["add_generation_prompt"] = add_generation_prompt;
  c["bos_token"] = "<s>";
  c["eos_token"] = "</s>";
  return c;
}

ordered_json with_tools(ordered_json c) {
  c["tools"] = j(kTools);
  return c;
}

std::vector<Conversation> conversations() {
  const ordered_json sys_user = j(R"([{"role": "system", "content": "You are a helpful assistant."},
                                       {"role": "user", "content": "What is the capital of France?"}])");
  const ordered_json multi = j(R"([{"role": "user", "content": "Hi there"},
                                    {"role": "assistant", "content": "Hello! How can I help?"},
                                    {"role": "user", "content": "Tell me a joke."}])");
  const ordered_json trailing = j(R"([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4"}])");
  const ordered_json unicode = j(R"([{"role": "user", "content": "  héllo 世界 \"double\" 'single' <b>&amp;</b> back\\slash\n\ttab  "},
                                      {"role": "assistant", "content": "<think>hmm</think>Bonjour 🌍"},
                                      {"role": "user", "content": "Encore"}])");
  auto tool_turns = [](bool args_as_string) {
    ordered_json call = j(R"({"id": "call12345", "type": "function", "function": {"name": "get_weather"}})");
    call["function"]["arguments"] = args_as_string ? ordered_json(R"({"location": "Paris, France", "unit": "celsius"})")
                                                   : j(R"({"location": "Paris, France", "unit": "celsius"})");
    ordered_json m = j(R"([{"role": "system", "content": "You can call tools."},
                           {"role": "user", "content": "What's the weather in Paris?"}])");
    ordered_json assistant = j(R"({"role": "assistant", "content": null})");
    assistant["tool_calls"] = ordered_json::array({call});
    m.push_back(assistant);
    m.push_back(j(R"({"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                      "content": "{\"temperature\": 22, \"condition\": \"sunny\"}"})"));
    m.push_back(j(R"({"role": "assistant", "content": "It is 22 °C and sunny in Paris."})"));
    m.push_back(j(R"({"role": "user", "content": "Thanks!"})"));
    return m;
  };
  ordered_json fire = base(sys_user, true);
  fire["functions"] = ordered_json(kTools).get<std::string>();
  fire["datetime"] = "2024-07-26";
  return {
      {"system_user", base(sys_user, true)},
      {"system_user_no_generation_prompt", base(sys_user, false)},
      {"user_only", base(j(R"([{"role": "user", "content": "Hello"}])"), true)},
      {"multi_turn", base(multi, true)},
      {"trailing_assistant", base(trailing, false)},
      {"unicode_and_escapes", base(unicode, true)},
      {"tools_only", with_tools(base(sys_user, true))},
      {"tool_call_args_object", with_tools(base(tool_turns(false), true))},
      {"tool_call_args_string", with_tools(base(tool_turns(true), true))},
      {"tool_call_without_tools", base(tool_turns(false), false)},
      {"extra_variables", fire},
  };
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  if (!fs::is_directory(kTemplates)) return names;
  for (const auto& e : fs::directory_iterator(kTemplates)) {
    if (e.path().extension() == ".jinja") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class RealTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTemplate, RendersAsJinja2DoesForEveryConversation) {
  if (!test::jinja2_available()) GTEST_SKIP() << "/usr/bin/python3 has no jinja2 (Debian: python3-jinja2): no oracle";
  const fs::path path = kTemplates / GetParam();
  const JinjaTemplate tmpl = JinjaTemplate::parse(test::read_text(path), GetParam());
  JinjaRenderOptions opts;
  opts.now = test::kFixedNow;
  int identical = 0, both_raise = 0;
  for (const Conversation& c : conversations()) {
    SCOPED_TRACE(std::string("conversation ") + c.name);
    const test::OracleResult want = test::jinja2_render_file(path, c.context);
    std::string got, error;
    bool threw = false;
    try {
      got = tmpl.render(c.context, opts);
    } catch (const Error& e) {
      threw = true;
      error = e.what();
    }
    if (!want.ok) {
      EXPECT_TRUE(threw) << "Jinja2 raised (" << want.error << ") but tessera rendered:\n" << got;
      if (threw) ++both_raise;
      continue;
    }
    ASSERT_FALSE(threw) << "tessera raised: " << error << "\nJinja2 rendered:\n" << want.output;
    EXPECT_EQ(got, want.output);
    if (got == want.output) ++identical;
  }
  std::printf("[ oracle   ] %s: %d identical, %d raise on both sides, of %zu conversations\n", GetParam().c_str(),
              identical, both_raise, conversations().size());
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.substr(0, info.param.size() - 6);
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(SharedTemplates, RealTemplate, ::testing::ValuesIn(template_names()), test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RealTemplate);

TEST(RealTemplates, TheSharedFolderHasTemplates) {
  EXPECT_GE(template_names().size(), 10u) << "no templates in " << kTemplates;
}

}  // namespace
}  // namespace tessera
