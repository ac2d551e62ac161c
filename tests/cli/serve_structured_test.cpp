// Structured output and tool calling in `tessera serve`: response_format, vLLM's guided_* fields,
// tools and tool_choice, over HTTP with stories260K (a model that knows nothing of JSON, so every
// valid output is the constraint's doing), plus the parts (request parsing, tool-call reading,
// template rendering) in-process.
#include <gtest/gtest.h>

#include <regex>

#include "serve/chat_template.h"
#include "serve/openai_request.h"
#include "serve/api_error.h"
#include "serve/tool_calls.h"
#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

// A small schema: two required properties, no others.
const json kPersonSchema = json::parse(R"({"type": "object",
  "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
  "required": ["name", "age"], "additionalProperties": false})");

// The checks of kPersonSchema by hand (the python3-jsonschema oracle below checks them again).
bool is_person(const json& j) {
  if (!j.is_object() || j.size() != 2 || !j.contains("name") || !j.contains("age")) return false;
  if (!j["name"].is_string() || !j["age"].is_number_integer()) return false;
  std::string name = j["name"];
  size_t chars = 0;
  for (unsigned char c : name) chars += (c & 0xC0) != 0x80;
  return chars <= 12 && j["age"].get<int64_t>() >= 0 && j["age"].get<int64_t>() <= 120;
}

// Each instance validated against `schema` by Debian's python3-jsonschema: the error lines, "" when
// all are valid; nullopt when python3 or jsonschema is missing.
std::optional<std::string> jsonschema_errors(const json& schema, const std::vector<json>& instances) {
  if (std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) return std::nullopt;
  test::TempDir dir;
  const std::string in = dir.write("cases.json", json({{"schema", schema}, {"instances", instances}}).dump());
  const std::string out = dir.path() + "/errors.txt";
  const std::string cmd = "python3 -c \"import json,sys,jsonschema\n"
                          "d=json.load(open(sys.argv[1]))\n"
                          "v=jsonschema.Draft202012Validator(d['schema'])\n"
                          "for i,x in enumerate(d['instances']):\n"
                          "  for e in v.iter_errors(x): print(i, e.message)\n\" '" + in + "' > '" + out + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) return "python3 failed: " + test::read_text(out);
  return test::read_text(out);
}

json post(httplib::Client& c, const std::string& path, const json& body, int expect = 200) {
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response from " << path;
    return json();
  }
  EXPECT_EQ(res->status, expect) << body.dump() << "\n" << res->body;
  if (res->get_header_value("Content-Type") == "text/event-stream") return json(res->body);  // the raw SSE text
  return json::parse(res->body);
}

const json kChatMessages = json::array({{{"role", "user"}, {"content", "Tell me about a girl."}}});

// One generation's text, whole or streamed, from either endpoint.
struct Generated {
  std::string text;
  std::string finish_reason;
};
Generated generate(httplib::Client& c, bool chat, bool stream, json body) {
  if (chat) {
    body["messages"] = kChatMessages;
  } else {
    body["prompt"] = "Once upon a time";
  }
  body["stream"] = stream;
  const json r = post(c, chat ? "/v1/chat/completions" : "/v1/completions", body);
  if (stream) {
    const test::StreamedResponse s = test::parse_stream(r.get<std::string>());
    EXPECT_TRUE(s.done);
    return {s.text, s.finish_reason};
  }
  const json& choice = r["choices"][0];
  return {chat ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>(),
          choice["finish_reason"]};
}

class ServeStructured : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    server_ = new ServerProcess({"-p", test::serve_pipeline(*dir_)});
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static ServerProcess* server_;
};
test::TempDir* ServeStructured::dir_ = nullptr;
ServerProcess* ServeStructured::server_ = nullptr;

// Both endpoints, streamed and not, greedy and sampled over seeds: every output parses and validates.
TEST_F(ServeStructured, JsonSchemaOutputValidatesOnBothEndpointsStreamedOrNot) {
  auto c = server_->client();
  const json format = {{"type", "json_schema"},
                       {"json_schema", {{"name", "person"}, {"schema", kPersonSchema}, {"strict", true}}}};
  std::vector<json> outputs;
  for (bool chat : {false, true}) {
    for (bool stream : {false, true}) {
      for (int seed : {-1, 1, 2}) {
        json body = {{"max_tokens", 48}, {"response_format", format}, {"temperature", seed < 0 ? 0.0 : 1.0}};
        if (seed >= 0) body["seed"] = seed;
        const Generated g = generate(c, chat, stream, body);
        SCOPED_TRACE(body.dump() + (chat ? " chat" : " completions") + (stream ? " stream" : ""));
        EXPECT_EQ(g.finish_reason, "stop") << g.text;
        const json j = json::parse(g.text, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << "not JSON: " << g.text;
        EXPECT_TRUE(is_person(j)) << g.text;
        outputs.push_back(j);
      }
    }
  }
  if (const auto errors = jsonschema_errors(kPersonSchema, outputs)) {
    EXPECT_EQ(*errors, "") << json(outputs).dump();
  } else {
    std::cout << "python3-jsonschema is not installed: outputs checked by hand only\n";
  }
  // Greedy output does not depend on streaming.
  const json greedy = {{"max_tokens", 48}, {"response_format", format}, {"temperature", 0}};
  EXPECT_EQ(generate(c, true, false, greedy).text, generate(c, true, true, greedy).text);
  const std::string page = c.Get("/metrics")->body;
  EXPECT_GE(test::metric(page, "tessera_constrained_requests_total{type=\"json_schema\"}").value_or(0), 14);
}

TEST_F(ServeStructured, JsonObjectGuidedJsonChoiceAndRegexHoldOnBothEndpoints) {
  auto c = server_->client();
  const std::regex pattern("[a-z]{3,8}-[0-9]{2}");
  const json choices = {"red fox", "blue whale", "green frog"};
  for (bool chat : {false, true}) {
    for (int seed : {1, 2, 3}) {
      SCOPED_TRACE((chat ? "chat seed " : "completions seed ") + std::to_string(seed));
      const json sampled = {{"max_tokens", 48}, {"temperature", 1.0}, {"seed", seed}};
      json body = sampled;
      body["response_format"] = {{"type", "json_object"}};
      const Generated obj = generate(c, chat, seed == 2, body);
      const json j = json::parse(obj.text, nullptr, false);
      EXPECT_TRUE(j.is_object()) << obj.text;

      body = sampled;
      body["guided_json"] = kPersonSchema.dump();  // as JSON text, as vLLM also takes it
      const Generated person = generate(c, chat, seed == 3, body);
      EXPECT_TRUE(is_person(json::parse(person.text, nullptr, false))) << person.text;

      body = sampled;
      body["guided_choice"] = choices;
      const Generated choice = generate(c, chat, seed == 1, body);
      EXPECT_NE(std::find(choices.begin(), choices.end(), json(choice.text)), choices.end()) << choice.text;

      body = sampled;
      body["guided_regex"] = "[a-z]{3,8}-[0-9]{2}";
      const Generated regex = generate(c, chat, false, body);
      EXPECT_TRUE(std::regex_match(regex.text, pattern)) << regex.text;
      EXPECT_EQ(regex.finish_reason, "stop");

      body = sampled;
      body["guided_grammar"] = "root ::= (\"yes\" | \"no\") \", \" [a-z]+ \".\"\n";
      const Generated grammar = generate(c, chat, false, body);
      EXPECT_TRUE(std::regex_match(grammar.text, std::regex("(yes|no), [a-z]+\\."))) << grammar.text;
    }
  }
}

// Refusals name the field (and, from the constraint, the keyword or the grammar's line:column).
TEST_F(ServeStructured, RefusalsAreBadRequestsNamingTheField) {
  auto c = server_->client();
  struct Case {
    bool chat;
    json fields;
    std::string param;
    std::string message;  // a regex the message must contain
  };
  const json tool = {{"type", "function"},
                     {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}};
  const json bad_tool = json::parse(R"({"type": "function", "function": {"name": "lookup",
      "parameters": {"type": "object", "if": {"required": ["x"]}, "then": {"required": ["y"]}}}})");
  const json refused_schema = json::parse(R"({"type": "json_schema", "json_schema": {"name": "x",
      "schema": {"type": "object", "properties": {"y": {"type": "object", "not": {"required": ["z"]}}}}}})");
  const Case cases[] = {
      {false, {{"response_format", {{"type", "xml"}}}}, "response_format.type", "json_object or json_schema"},
      {true, {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
       "response_format.json_schema.schema", "required"},
      {true, {{"response_format", refused_schema}},
       "response_format.json_schema.schema", "unsupported keyword 'not' at /properties/y"},
      {false, {{"guided_grammar", "root ::= \"a\"\nitem ::= (\"b\" | \n"}}, "guided_grammar", "guided_grammar:[0-9]+:[0-9]+"},
      {false, {{"guided_regex", "[a-z"}}, "guided_regex", "guided_regex"},
      {true, {{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a+"}}, "guided_regex",
       "both constrain"},
      {false, {{"guided_choice", json::array()}}, "guided_choice", "empty"},
      {true, {{"tools", json::array({tool})}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}},
       "tool_choice.function.name", "not one of the request's tools"},
      {true, {{"tools", json::array({tool})}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
       "tool_choice", "give only one"},
      {true, {{"tool_choice", "required"}}, "tool_choice", "no 'tools'"},
      {true, {{"tools", {tool, bad_tool}}, {"tool_choice", "required"}}, "tools[1].function.parameters",
       "unsupported keyword 'if' at /"},
      {true, {{"tools", {{{"type", "function"}, {"function", {{"name", "has space"}}}}}}}, "tools[0].function.name",
       "1 to 64 characters"},
      {false, {{"tools", json::array({tool})}}, "tools", "unrecognized"},
  };
  for (const Case& k : cases) {
    json body = k.fields;
    if (k.chat) body["messages"] = kChatMessages;
    else body["prompt"] = "hi";
    const json r = post(c, k.chat ? "/v1/chat/completions" : "/v1/completions", body, 400);
    SCOPED_TRACE(body.dump());
    EXPECT_EQ(r["error"]["param"], k.param) << r.dump();
    EXPECT_TRUE(std::regex_search(r["error"]["message"].get<std::string>(), std::regex(k.message))) << r.dump();
  }
}

const json kWeatherTool = json::parse(R"({"type": "function", "function": {"name": "get_weather",
  "description": "The weather in a city now.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                 "required": ["city", "days"], "additionalProperties": false}}})");
const json kTimeTool = json::parse(R"({"type": "function", "function": {"name": "get_time"}})");

bool valid_weather_arguments(const json& a) {
  return a.is_object() && a.size() == 2 && a["city"].is_string() && a["days"].is_number_integer() &&
         a["days"].get<int>() >= 1 && a["days"].get<int>() <= 7;
}

// tool_choice required and named: the answer is a call (finish_reason tool_calls) whose arguments
// parse and validate, whole and streamed.
TEST_F(ServeStructured, RequiredAndNamedToolChoiceGiveValidCalls) {
  auto c = server_->client();
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const json& choice : {json("required"), named}) {
    for (int seed : {1, 2}) {
      json body = {{"messages", kChatMessages}, {"tools", {kTimeTool, kWeatherTool}}, {"tool_choice", choice},
                   {"max_tokens", 96}, {"temperature", 1.0}, {"seed", seed}};
      SCOPED_TRACE(body.dump());
      const json r = post(c, "/v1/chat/completions", body);
      const json& ch = r["choices"][0];
      EXPECT_EQ(ch["finish_reason"], "tool_calls") << r.dump();
      EXPECT_TRUE(ch["message"]["content"].is_null());
      ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r.dump();
      const json& call = ch["message"]["tool_calls"][0];
      EXPECT_EQ(call["type"], "function");
      EXPECT_TRUE(std::regex_match(call["id"].get<std::string>(), std::regex("call_[A-Za-z0-9]{24}")));
      const std::string name = call["function"]["name"];
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      if (choice.is_object()) EXPECT_EQ(name, "get_weather");
      if (name == "get_weather") EXPECT_TRUE(valid_weather_arguments(args)) << args.dump();
      else EXPECT_TRUE(args.is_object());

      body["stream"] = true;
      const std::string sse = post(c, "/v1/chat/completions", body).get<std::string>();
      std::string finish, streamed_name, streamed_args, content;
      for (const std::string& d : test::sse_data(sse)) {
        if (d == "[DONE]") continue;
        const json j = json::parse(d);
        const json& delta = j["choices"][0]["delta"];
        if (delta.contains("content")) content += delta["content"].get<std::string>();
        if (delta.contains("tool_calls")) {
          EXPECT_EQ(delta["tool_calls"][0]["index"], 0);
          streamed_name += delta["tool_calls"][0]["function"]["name"].get<std::string>();
          streamed_args += delta["tool_calls"][0]["function"]["arguments"].get<std::string>();
        }
        if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
      }
      EXPECT_EQ(finish, "tool_calls") << sse;
      EXPECT_EQ(content, "") << "no text beside the call";
      // Sampled with the same seed: the same call.
      EXPECT_EQ(streamed_name, name);
      EXPECT_EQ(json::parse(streamed_args), args);
    }
  }
}

// tool_choice auto: text stays content (streamed as it comes); an output that is a call object (here
// made one by a response_format schema, as stories260K never writes one) becomes tool_calls, whole
// and streamed.
TEST_F(ServeStructured, AutoToolChoiceReadsCallsAndLeavesTextAsContent) {
  auto c = server_->client();
  json body = {{"messages", kChatMessages}, {"tools", {kTimeTool, kWeatherTool}}, {"max_tokens", 12}, {"temperature", 0}};
  const json text = post(c, "/v1/chat/completions", body);
  EXPECT_EQ(text["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(text["choices"][0]["message"].contains("tool_calls"));
  body["stream"] = true;
  const test::StreamedResponse streamed = test::parse_stream(post(c, "/v1/chat/completions", body).get<std::string>());
  EXPECT_EQ(streamed.text, text["choices"][0]["message"]["content"]);
  // How many chunks the text comes in depends on how far generation is ahead of the writer (on a
  // loaded machine stories260K writes all 12 tokens before it wakes): that text is not held back is
  // classify_output_start's test below.

  const json call_schema = json::parse(R"({"type": "object", "properties": {"name": {"const": "get_time"},
      "arguments": {"type": "object", "properties": {}, "additionalProperties": false}},
      "required": ["name", "arguments"], "additionalProperties": false})");
  body = {{"messages", kChatMessages}, {"tools", {kTimeTool, kWeatherTool}}, {"max_tokens", 48}, {"temperature", 0},
          {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "call"}, {"schema", call_schema}}}}}};
  const json called = post(c, "/v1/chat/completions", body);
  EXPECT_EQ(called["choices"][0]["finish_reason"], "tool_calls") << called.dump();
  EXPECT_EQ(called["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time") << called.dump();
  EXPECT_EQ(called["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  body["stream"] = true;
  const std::string sse = post(c, "/v1/chat/completions", body).get<std::string>();
  const test::StreamedResponse s = test::parse_stream(sse);
  EXPECT_EQ(s.finish_reason, "tool_calls") << sse;
  EXPECT_EQ(s.text, "") << "a call is not streamed as content";
  EXPECT_NE(sse.find(R"("tool_calls":[{"function":{"arguments":"{}","name":"get_time"},"id":"call_)"), std::string::npos)
      << sse;
}

// The round trip: the model's call sent back with the tool's result; tool_choice none answers in text.
TEST_F(ServeStructured, ToolResultsAreAcceptedAndToolChoiceNoneAnswersInText) {
  auto c = server_->client();
  const json messages = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}])");
  const json r = post(c, "/v1/chat/completions", {{"messages", messages}, {"tools", json::array({kWeatherTool})},
                                                  {"tool_choice", "none"}, {"max_tokens", 8}});
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string()) << r.dump();
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(r["choices"][0]["finish_reason"], "tool_calls");
  json bad = messages;
  bad[1]["tool_calls"][0]["function"]["arguments"] = "{city";
  const json e = post(c, "/v1/chat/completions", {{"messages", bad}, {"max_tokens", 8}}, 400);
  EXPECT_EQ(e["error"]["param"], "messages[1].tool_calls[0].function.arguments");
  bad = messages;
  bad[2].erase("tool_call_id");
  EXPECT_EQ(post(c, "/v1/chat/completions", {{"messages", bad}}, 400)["error"]["param"], "messages[2].tool_call_id");
}

std::vector<serve::ToolDef> weather_tools() {
  serve::OpenAiRequest r = serve::parse_openai_request(
      serve::Endpoint::chat, json({{"messages", kChatMessages}, {"tools", {kWeatherTool, kTimeTool}}}).dump());
  return r.tools;
}

TEST(ToolCalls, OutputIsReadAsCallsInTheFormatsModelsWrite) {
  const auto tools = weather_tools();
  ASSERT_EQ(tools.size(), 2u);
  EXPECT_EQ(tools[1].parameters.dump(), json({{"type", "object"}}).dump());  // parameters left out
  const auto one = serve::parse_tool_calls(" {\"name\": \"get_weather\", \"arguments\": {\"days\": 2, \"city\": \"Oslo\"}}\n", tools);
  ASSERT_TRUE(one);
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].name, "get_weather");
  EXPECT_EQ((*one)[0].arguments, "{\"days\":2,\"city\":\"Oslo\"}");  // the order the model wrote
  const auto tagged = serve::parse_tool_calls(
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"days\": 1}}\n</tool_call>", tools);
  ASSERT_TRUE(tagged);
  ASSERT_EQ(tagged->size(), 2u);
  EXPECT_EQ((*tagged)[1].arguments, "{\"city\":\"Rome\",\"days\":1}");
  EXPECT_NE((*tagged)[0].id, (*tagged)[1].id);
  const auto mistral_id = serve::parse_tool_calls("{\"name\": \"get_time\"}", tools, true, /*short_ids=*/true);
  EXPECT_TRUE(std::regex_match((*mistral_id)[0].id, std::regex("[A-Za-z0-9]{9}"))) << (*mistral_id)[0].id;
  EXPECT_EQ(serve::parse_tool_calls(
                "<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{\"name\": \"get_time\"}</tool_call>", tools,
                /*parallel=*/false)->size(), 1u);
  const auto mistral = serve::parse_tool_calls("[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}]", tools);
  ASSERT_TRUE(mistral);
  EXPECT_EQ((*mistral)[0].name, "get_time");
  // Not calls: text, an unknown tool, other members, arguments that are not an object, text around a call.
  for (const char* text : {"It is sunny.", "{\"name\": \"get_mood\", \"arguments\": {}}",
                           "{\"name\": \"get_time\", \"arguments\": {}, \"why\": 1}",
                           "{\"name\": \"get_time\", \"arguments\": [1]}", "{\"name\": \"get_time\"} and more",
                           "Sure: <tool_call>{\"name\": \"get_time\"}</tool_call>", "[]", "{}"}) {
    EXPECT_FALSE(serve::parse_tool_calls(text, tools)) << text;
  }
  using serve::OutputStart;
  EXPECT_EQ(serve::classify_output_start(""), OutputStart::undecided);
  EXPECT_EQ(serve::classify_output_start("\n <tool_"), OutputStart::undecided);
  EXPECT_EQ(serve::classify_output_start("<tool_call>{"), OutputStart::call);
  EXPECT_EQ(serve::classify_output_start(" {\"na"), OutputStart::call);
  EXPECT_EQ(serve::classify_output_start("[TOOL"), OutputStart::undecided);
  EXPECT_EQ(serve::classify_output_start("<b>"), OutputStart::text);
  EXPECT_EQ(serve::classify_output_start("Once"), OutputStart::text);
}

TEST(ToolCalls, TheCallSchemaIsAnAnyOfOverTheTools) {
  const auto tools = weather_tools();
  const json all = json::parse(serve::tool_call_constraint(tools).text);
  ASSERT_EQ(all["anyOf"].size(), 2u);
  EXPECT_EQ(all["anyOf"][0]["properties"]["name"], json({{"const", "get_weather"}}));
  EXPECT_EQ(all["anyOf"][0]["properties"]["arguments"], kWeatherTool["function"]["parameters"]);
  EXPECT_EQ(all["anyOf"][1]["required"], json({"name", "arguments"}));
  EXPECT_EQ(all["anyOf"][1]["additionalProperties"], false);
  const json one = json::parse(serve::tool_call_constraint(tools, "get_time").text);
  EXPECT_EQ(one["properties"]["name"]["const"], "get_time");
  EXPECT_EQ(serve::tool_call_constraint(tools).type, "json_schema");
}

// Tools go to a template that renders them (Qwen 2.5's, with the call's arguments as an object);
// other formats get them in the system message, calls and results as text.
TEST(ToolCalls, TemplatesRenderToolsOrGetThemAsText) {
  const auto request = serve::parse_openai_request(serve::Endpoint::chat, R"({"messages": [
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "abc123XYZ", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
      {"role": "tool", "tool_call_id": "abc123XYZ", "content": "rain"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]})");
  const std::string qwen_source = test::read_text(test::kShared + "/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  const serve::ChatTemplate qwen = serve::ChatTemplate::from_jinja(qwen_source);
  EXPECT_TRUE(qwen.renders_tools());
  const std::string q = qwen.render_text(request.messages, request.tools);
  // The tool as sent, members in the client's order (city before days).
  EXPECT_NE(q.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
                   "\"The weather.\", \"parameters\": "
                   "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "),
            std::string::npos) << q;
  EXPECT_NE(q.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", "
                   "\"days\": 2}}\n</tool_call><|im_end|>"),
            std::string::npos) << q;
  EXPECT_NE(q.find("<tool_response>\nrain\n</tool_response>"), std::string::npos) << q;

  // Other tool templates take the same conversation: the call's arguments print as a JSON object.
  for (const char* name : {"meta-llama-Llama-3.1-8B-Instruct.jinja", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
                           "mistralai-Mistral-Nemo-Instruct-2407.jinja"}) {
    const serve::ChatTemplate t = serve::ChatTemplate::from_jinja(test::read_text(test::kShared + "/templates/" + name));
    EXPECT_TRUE(t.renders_tools()) << name;
    EXPECT_EQ(t.wants_short_call_ids(), std::string(name).rfind("mistralai", 0) == 0) << name;
    std::string text;
    EXPECT_NO_THROW(text = t.render_text(request.messages, request.tools)) << name;
    EXPECT_NE(text.find(R"({"city": "Oslo", "days": 2})"), std::string::npos) << name << "\n" << text;
  }

  const serve::ChatTemplate chatml(serve::ChatFormat::chatml);
  EXPECT_FALSE(chatml.renders_tools());
  const std::string t = chatml.render_text(request.messages, request.tools);
  EXPECT_EQ(t.rfind("<|im_start|>system\n# Tools\n", 0), 0u) << t;
  EXPECT_NE(t.find("{\"name\":\"get_weather\",\"description\":\"The weather.\",\"parameters\":{\"type\":\"object\","
                   "\"properties\":{\"city\""),
            std::string::npos) << t;
  EXPECT_NE(t.find("<|im_start|>assistant\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":2}}"),
            std::string::npos) << t;
  EXPECT_NE(t.find("<|im_start|>user\nResult of get_weather: rain<|im_end|>"), std::string::npos) << t;
}

TEST(ToolCalls, RequestFieldsAreCheckedAndKeptInOrder) {
  using serve::Endpoint;
  const auto r = serve::parse_openai_request(Endpoint::completions, R"({"prompt": "a", "response_format":
      {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"z": {}, "a": {}}}}}})");
  ASSERT_TRUE(r.constraint);
  EXPECT_EQ(r.constraint->type, "json_schema");
  EXPECT_EQ(r.constraint->where, "response_format.json_schema.schema");
  EXPECT_EQ(r.constraint->text, R"({"type":"object","properties":{"z":{},"a":{}}})");  // z stays first
  const auto text = serve::parse_openai_request(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}],
      "response_format": {"type": "text"}, "tools": [], "tool_choice": "auto"})");
  EXPECT_FALSE(text.constraint);
  EXPECT_EQ(text.tool_choice, serve::ToolChoice::none);
  const auto choice = serve::parse_openai_request(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}],
      "guided_choice": ["x", "y"]})");
  EXPECT_EQ(choice.constraint->type, "choice");
  EXPECT_EQ(choice.constraint->text, R"(["x","y"])");
}

}  // namespace
}  // namespace tessera
