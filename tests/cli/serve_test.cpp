// `tessera serve` over real HTTP on loopback: the OpenAI API, streaming, errors and auth (limits,
// cancellation and shutdown: serve_limits_test.cpp).
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>

#include "serve/chat_template.h"
#include "serve_test_util.h"
#include "tessera/gguf.h"
#include "tessera/tokenizer.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

const std::string kStory = "Once upon a time";
// Greedy continuation of kStory by stories260K (the reference's completion_text; see cli_test.cpp).
const std::string kStoryContinuation = ", there was a little girl named Lily. She";

std::unique_ptr<Tokenizer> stories_tokenizer() {
  return Tokenizer::create(load_vocabulary(*GgufFile::open(test::kStoriesF32)));
}

using test::post_json;

class Serve : public ::testing::Test {
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
test::TempDir* Serve::dir_ = nullptr;
ServerProcess* Serve::server_ = nullptr;

TEST_F(Serve, CompletionGivesTheGreedyTextAndUsage) {
  auto c = server_->client();
  const json r = post_json(c, "/v1/completions", {{"model", "stories260K-f32"}, {"prompt", kStory}, {"max_tokens", 12}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "stories260K-f32");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["text"], kStoryContinuation);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);  // BOS + 4 tokens
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r["usage"]["total_tokens"], 17);
}

TEST_F(Serve, CompletionAcceptsTokenIdsAndStopsAtAStopString) {
  auto c = server_->client();
  const json ids = post_json(c, "/v1/completions", {{"prompt", {1, 403, 407, 261, 378}}, {"max_tokens", 12}});
  EXPECT_EQ(ids["choices"][0]["text"], kStoryContinuation);
  const json stopped = post_json(c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 12}, {"stop", "Lily"}});
  EXPECT_EQ(stopped["choices"][0]["text"], ", there was a little girl named ");
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
}

TEST_F(Serve, CompletionLogprobsAreGivenPerToken) {
  auto c = server_->client();
  const json r = post_json(c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 6}, {"logprobs", 3}});
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u) << r.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  std::string joined;
  for (size_t i = 0; i < 6; ++i) {
    joined += lp["tokens"][i].get<std::string>();
    const double chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    double best = -1e30;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(chosen, best, 1e-5);
  }
  EXPECT_EQ(joined, r["choices"][0]["text"]);
}

TEST_F(Serve, LogprobsEndWithTheTextAtAStopString) {
  // The stop string spans tokens and is matched only at its last: the text ends before "named",
  // and the tokens from there on are not part of the answer, in either endpoint's logprobs (usage
  // still counts every generated token).
  auto c = server_->client();
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", kStory}, {"max_tokens", 12}, {"stop", "named Lily."}, {"logprobs", 1}});
  ASSERT_EQ(r["choices"][0]["text"], ", there was a little girl ") << r.dump();
  const std::string text = r["choices"][0]["text"];
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_FALSE(lp["tokens"].empty()) << r.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), lp["tokens"].size());
  ASSERT_EQ(lp["text_offset"].size(), lp["tokens"].size());
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    EXPECT_LT(joined.size(), text.size()) << "token " << i << " starts past the text: " << r.dump();
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined.substr(0, text.size()), text);  // the last token may run past the cut
  EXPECT_GT(r["usage"]["completion_tokens"].get<size_t>(), lp["tokens"].size());

  const json chat = post_json(c, "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                               {"max_tokens", 12}, {"stop", " "}, {"logprobs", true}});
  const std::string content = chat["choices"][0]["message"]["content"];
  ASSERT_EQ(chat["choices"][0]["finish_reason"], "stop") << chat.dump();
  std::string chat_joined;
  for (const json& t : chat["choices"][0]["logprobs"]["content"]) {
    EXPECT_LT(chat_joined.size(), content.size() + (content.empty() ? 1 : 0)) << chat.dump();
    chat_joined += t["token"].get<std::string>();
  }
  EXPECT_EQ(chat_joined.substr(0, content.size()), content);
}

TEST_F(Serve, TokenizeGivesTheIdsAGenerationStartsFromAndDetokenizeTheirText) {
  auto c = server_->client();
  const json ids = post_json(c, "/tokenize", {{"prompt", kStory}});
  EXPECT_EQ(ids["tokens"], json({1, 403, 407, 261, 378})) << ids.dump();  // BOS + the golden file's ids
  EXPECT_EQ(ids["count"], 5);
  EXPECT_EQ(ids["max_model_len"], 512);
  EXPECT_EQ(post_json(c, "/tokenize", {{"prompt", kStory}, {"add_special_tokens", false}})["tokens"],
            json({403, 407, 261, 378}));
  EXPECT_EQ(post_json(c, "/detokenize", {{"tokens", ids["tokens"]}})["prompt"], kStory);
  // Chat: the rendered template, as a chat completion counts its prompt.
  const json messages = {{{"role", "user"}, {"content", "Tell me about a cat."}}};
  const json chat_ids = post_json(c, "/tokenize", {{"messages", messages}});
  const json chat = post_json(c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 2}});
  EXPECT_EQ(chat_ids["count"], chat["usage"]["prompt_tokens"]) << chat_ids.dump();
}

TEST_F(Serve, CompletionTopLogprobsHoldTheChosenTokenToo) {
  // As OpenAI's legacy API: "up to logprobs + 1" entries, the sampled token always among them.
  auto c = server_->client();
  const json r = post_json(c, "/v1/completions",
                           {{"prompt", kStory}, {"max_tokens", 6}, {"logprobs", 0}, {"temperature", 1.5}, {"seed", 3}});
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["top_logprobs"].size(), 6u) << r.dump();
  for (size_t i = 0; i < 6; ++i) {
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 1u) << top.dump();
    EXPECT_EQ(top.at(lp["tokens"][i].get<std::string>()), lp["token_logprobs"][i]);
  }
}

TEST_F(Serve, ChatTopLogprobsZeroNeedsNoLogprobs) {
  // What some clients send by default: no logprobs asked for, so none given, and no 400.
  auto c = server_->client();
  const json r = post_json(c, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3},
                            {"logprobs", false}, {"top_logprobs", 0}});
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null()) << r.dump();
}

TEST_F(Serve, ChatUsesTheDefaultTemplateWithoutOneInTheModel) {
  auto c = server_->client();
  const json messages = {{{"role", "system"}, {"content", "You tell stories."}},
                         {{"role", "user"}, {"content", "Tell me about a cat."}}};
  const json r = post_json(c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 10}, {"user", "alice"}});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(r["choices"][0]["message"]["content"].get<std::string>().empty());
  // The prompt is the documented default template, tokenized as one text after BOS.
  const auto tok = stories_tokenizer();
  const std::vector<int32_t> ids = tok->encode(
      "<|system|>\nYou tell stories.\n<|user|>\nTell me about a cat.\n<|assistant|>\n", true);
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 10);
}

TEST_F(Serve, StreamedCompletionEqualsTheWholeOne) {
  auto c = server_->client();
  const json whole = post_json(c, "/v1/completions", {{"prompt", "Lily and Ben"}, {"max_tokens", 20}});
  auto res = c.Post("/v1/completions",
                    json({{"prompt", "Lily and Ben"}, {"max_tokens", 20}, {"stream", true},
                          {"stream_options", {{"include_usage", true}}}}).dump(),
                    "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const auto s = test::parse_stream(res->body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(test::sse_data(res->body).back(), "[DONE]");
  EXPECT_EQ(s.text, whole["choices"][0]["text"]);
  EXPECT_EQ(s.finish_reason, whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.usage_chunk, whole["usage"]);
  EXPECT_TRUE(s.usage.is_null()) << "usage sent twice: on the last chunk and in the usage chunk";
  // Without include_usage it rides on the last chunk.
  auto plain = c.Post("/v1/completions",
                      json({{"prompt", "Lily and Ben"}, {"max_tokens", 20}, {"stream", true}}).dump(),
                      "application/json");
  ASSERT_TRUE(plain);
  const auto p = test::parse_stream(plain->body);
  EXPECT_EQ(p.usage, whole["usage"]);
  EXPECT_TRUE(p.usage_chunk.is_null());
}

TEST_F(Serve, StreamedChatOpensWithTheRoleAndEqualsTheWholeOne) {
  auto c = server_->client();
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 16}};
  const json whole = post_json(c, "/v1/chat/completions", body);
  json sbody = body;
  sbody["stream"] = true;
  auto res = c.Post("/v1/chat/completions", sbody.dump(), "application/json");
  ASSERT_TRUE(res);
  const auto data = test::sse_data(res->body);
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(json::parse(data[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(data[0])["object"], "chat.completion.chunk");
  const auto s = test::parse_stream(res->body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.usage, whole["usage"]);
}

TEST_F(Serve, SeededSamplingRepeatsAndTemperatureChangesTheText) {
  auto c = server_->client();
  const json body = {{"prompt", kStory}, {"max_tokens", 24}, {"temperature", 1.0}, {"top_p", 0.9},
                     {"top_k", 40}, {"min_p", 0.05}, {"seed", 7}};
  const json a = post_json(c, "/v1/completions", body);
  const json b = post_json(c, "/v1/completions", body);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_NE(a["choices"][0]["text"], kStoryContinuation);
}

TEST_F(Serve, ABodySentAsFormDataIsReadWholeUpToTheLimit) {
  // `curl -d` declares its body application/x-www-form-urlencoded; a JSON body past httplib's 8 KiB
  // form limit is still read whole (server.max_body_bytes is the limit).
  auto c = server_->client();
  const std::string body = json({{"prompt", kStory}, {"max_tokens", 12}}).dump() + std::string(9000, ' ');
  auto res = c.Post("/v1/completions", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], kStoryContinuation);
}

TEST_F(Serve, ChunkedBodiesAreHeldToTheLimitAndMultipartIsRefused) {
  // Should the server ever close before the client is done sending, the client's write fails with
  // EPIPE: a failed request here, not a test process killed by SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  auto c = server_->client();
  // Chunked (no Content-Length): 2 MiB of JSON whitespace, past the default 1 MiB limit.
  const std::string chunk(64 << 10, ' ');
  auto res = c.Post(
      "/v1/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset < (size_t(2) << 20)) {
          sink.write(chunk.data(), chunk.size());
        } else {
          sink.done();
        }
        return true;
      },
      "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413) << res->body;
  EXPECT_NE(res->body.find("server.max_body_bytes"), std::string::npos) << res->body;
  // `curl -F`: multipart form data is not an OpenAI request.
  auto form = server_->client().Post("/v1/completions", httplib::MultipartFormDataItems{{"prompt", "hi", "", ""}});
  ASSERT_TRUE(form) << httplib::to_string(form.error());
  EXPECT_EQ(form->status, 415) << form->body;
  EXPECT_NE(form->body.find("application/json"), std::string::npos) << form->body;
}

TEST_F(Serve, ABodyWithoutALengthIsRefusedAtOnce) {
  // A request with no Content-Length (or a bad one) has no body to wait for: its answer (400, or 405
  // / 404 as routing would give) comes at once, not at the read timeout (30 s).
  struct Case {
    std::string request, status, message;
  };
  for (const Case& c : std::vector<Case>{
           {"POST /v1/completions", "400", "without a body"},
           {"POST /v1/completions HTTP/1.1\r\nContent-Length: -5", "400", "invalid Content-Length '-5'"},
           {"DELETE /v1/completions", "405", "DELETE is not allowed on /v1/completions; use POST"},
           {"PUT /health", "405", "use GET"},
           {"PATCH /v2/x", "404", "no route for PATCH /v2/x"}}) {
    SCOPED_TRACE(c.request);
    test::RawConnection raw(server_->port());
    const auto start = std::chrono::steady_clock::now();
    const std::string line = c.request.find("HTTP/1.1") == std::string::npos ? c.request + " HTTP/1.1" : c.request;
    raw.send_raw(line + "\r\nHost: 127.0.0.1\r\n\r\n");
    const std::string reply = raw.read_until("}", std::chrono::seconds(10));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_NE(reply.find("HTTP/1.1 " + c.status), std::string::npos) << reply;
    EXPECT_NE(reply.find(c.message), std::string::npos) << reply;
  }
}

TEST_F(Serve, AmbiguousBodyFramingIsRefusedAndTheConnectionClosed) {
  // Two lengths, or a length and a transfer coding: a proxy in front could split the bytes into
  // other requests than this server would (request smuggling, RFC 9112 6.3).
  for (const std::string headers : {"Content-Length: 2\r\nContent-Length: 20\r\n",
                                    "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n"}) {
    SCOPED_TRACE(headers);
    test::RawConnection raw(server_->port());
    raw.send_raw("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + headers +
                 "\r\n{}");
    const std::string reply = raw.read_until("}", std::chrono::seconds(10));
    EXPECT_NE(reply.find("HTTP/1.1 400"), std::string::npos) << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  }
  auto health = server_->client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(Serve, ASecondServerCannotTakeThePort) {
  // Without SO_REUSEPORT the bind fails, instead of the kernel splitting connections between two
  // servers (possibly of different models).
  const std::string port = std::to_string(server_->port());
  const std::string cmd = std::string("'") + TESSERA_BINARY + "' serve --threads 1 --port " + port + " -p '" +
                          test::serve_pipeline(*dir_, "", "second.yaml") + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = pclose(p);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("cannot bind to 127.0.0.1:" + port), std::string::npos) << out;
}

TEST_F(Serve, ModelsHealthAndMetrics) {
  auto c = server_->client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "stories260K-f32");
  EXPECT_EQ(m["data"][0]["max_model_len"], 512);
  auto one = c.Get("/v1/models/stories260K-f32");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");

  post_json(c, "/v1/completions", {{"prompt", kStory}, {"max_tokens", 4}, {"user", "metrics-user"}});
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/plain; version=0.0.4"), std::string::npos);
  const std::string& p = page->body;
  EXPECT_GE(test::metric(p, R"(tessera_http_requests_total{route="/v1/completions",status="200"})").value_or(0), 1);
  EXPECT_EQ(test::metric(p, R"(tessera_user_requests_total{user="metrics-user",status="200"})"), 1);
  EXPECT_EQ(test::metric(p, R"(tessera_user_prompt_tokens_total{user="metrics-user"})"), 5);
  EXPECT_EQ(test::metric(p, R"(tessera_user_generation_tokens_total{user="metrics-user"})"), 4);
  EXPECT_EQ(test::metric(p, R"(tessera_user_time_to_first_token_seconds_count{user="metrics-user"})"), 1);
  EXPECT_EQ(test::metric(p, R"(tessera_user_inter_token_latency_seconds_count{user="metrics-user"})"), 3);
  for (const char* name : {"tessera_queue_depth", "tessera_kv_blocks_used", "tessera_kv_blocks_free",
                           "tessera_prefix_cache_hit_rate", "tessera_time_to_first_token_seconds_count",
                           "tessera_inter_token_latency_seconds_sum"}) {
    EXPECT_TRUE(test::metric(p, name).has_value()) << name << "\n" << p;
  }
  EXPECT_GT(*test::metric(p, "tessera_kv_blocks_free"), 0);
}

TEST(ServePrefixCache, UserDrivesIsolationAndThePerUserMetrics) {
  test::TempDir dir;
  const std::string pipeline = dir.write(
      "prefix.yaml", "extends: " + std::string(TESSERA_SOURCE_DIR) + "/pipelines/prefix.yaml\nmodel: " +
                         test::kStoriesF32 + "\nbackend: cpu\ncomponents:\n  cache: { plugin: prefix_lru, isolation: user }\n");
  ServerProcess server({"-p", pipeline});
  auto c = server.client();
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big red ball under a tree.";
  auto ask = [&](const std::string& user) {
    return post_json(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 16}, {"user", user}});
  };
  const json first = ask("alice");
  const json again = ask("alice");
  const json other = ask("bob");
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GE(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 16) << again.dump();
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // alice's blocks are hers
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);    // reuse changes no token
  EXPECT_EQ(other["choices"][0]["text"], first["choices"][0]["text"]);
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_GT(test::metric(page->body, R"(tessera_user_prefix_cache_hit_rate{user="alice"})").value_or(0), 0) << page->body;
  EXPECT_EQ(test::metric(page->body, R"(tessera_user_prefix_cache_hit_rate{user="bob"})").value_or(-1), 0) << page->body;
  EXPECT_EQ(test::metric(page->body, R"(tessera_user_prompt_cached_tokens_total{user="alice"})"),
            again["usage"]["prompt_tokens_details"]["cached_tokens"].get<double>());
  EXPECT_GT(test::metric(page->body, "tessera_prefix_cache_hit_rate").value_or(0), 0);
}

// --- Bad requests: each gets its status and an OpenAI-style error naming the field. ---

struct BadRequest {
  std::string name;
  std::string method;
  std::string path;
  std::string body;
  int status;
  json param;  // expected error.param (null: none)
  std::string code;
};

void PrintTo(const BadRequest& b, std::ostream* os) { *os << b.name; }

std::string long_prompt() {
  std::string s;
  for (int i = 0; i < 300; ++i) s += "the cat sat ";
  return s;
}

std::vector<BadRequest> bad_requests() {
  const std::string c = "/v1/completions", chat = "/v1/chat/completions";
  const std::string msg = R"("messages": [{"role": "user", "content": "hi"}])";
  return {
      {"malformed_json", "POST", c, R"({"prompt": "hi",)", 400, nullptr, "invalid_json"},
      {"body_not_object", "POST", c, R"(["prompt"])", 400, nullptr, "invalid_json"},
      {"number_beyond_a_double", "POST", c, R"({"prompt": "hi", "temperature": 1e400})", 400, nullptr, "invalid_json"},
      {"missing_prompt", "POST", c, R"({"max_tokens": 4})", 400, "prompt", "missing_required_parameter"},
      {"prompt_wrong_type", "POST", c, R"({"prompt": 42})", 400, "prompt", "invalid_type"},
      {"two_prompts", "POST", c, R"({"prompt": ["a", "b"]})", 400, "prompt", "invalid_value"},
      {"token_outside_vocab", "POST", c, R"({"prompt": [1, 99999]})", 400, "prompt", "invalid_value"},
      {"prompt_longer_than_context", "POST", c, json({{"prompt", long_prompt()}}).dump(), 400, "prompt",
       "context_length_exceeded"},
      {"max_tokens_past_context", "POST", c, R"({"prompt": "hi", "max_tokens": 600})", 400, "max_tokens",
       "context_length_exceeded"},
      {"max_tokens_string", "POST", c, R"({"prompt": "hi", "max_tokens": "12"})", 400, "max_tokens", "invalid_type"},
      {"max_tokens_zero", "POST", c, R"({"prompt": "hi", "max_tokens": 0})", 400, "max_tokens", "invalid_value"},
      {"max_tokens_float", "POST", c, R"({"prompt": "hi", "max_tokens": 1.5})", 400, "max_tokens", "invalid_type"},
      {"temperature_high", "POST", c, R"({"prompt": "hi", "temperature": 5})", 400, "temperature", "invalid_value"},
      {"top_p_zero", "POST", c, R"({"prompt": "hi", "top_p": 0})", 400, "top_p", "invalid_value"},
      {"top_k_negative", "POST", c, R"({"prompt": "hi", "top_k": -3})", 400, "top_k", "invalid_value"},
      {"min_p_high", "POST", c, R"({"prompt": "hi", "min_p": 1.5})", 400, "min_p", "invalid_value"},
      {"seed_float", "POST", c, R"({"prompt": "hi", "seed": 1.5})", 400, "seed", "invalid_type"},
      {"stop_not_strings", "POST", c, R"({"prompt": "hi", "stop": [1, 2]})", 400, "stop", "invalid_type"},
      {"stop_empty", "POST", c, R"({"prompt": "hi", "stop": ""})", 400, "stop", "invalid_value"},
      {"logprobs_too_many", "POST", c, R"({"prompt": "hi", "logprobs": 50})", 400, "logprobs", "invalid_value"},
      {"logprobs_with_stream", "POST", c, R"({"prompt": "hi", "logprobs": 2, "stream": true})", 400, "logprobs",
       "invalid_value"},
      {"stream_not_bool", "POST", c, R"({"prompt": "hi", "stream": "yes"})", 400, "stream", "invalid_type"},
      {"stream_options_without_stream", "POST", c, R"({"prompt": "hi", "stream_options": {"include_usage": true}})",
       400, "stream_options", "invalid_value"},
      {"user_not_string", "POST", c, R"({"prompt": "hi", "user": 7})", 400, "user", "invalid_type"},
      {"n_two", "POST", c, R"({"prompt": "hi", "n": 2})", 400, "n", "invalid_value"},
      {"unknown_field", "POST", c, R"({"prompt": "hi", "frobnicate": 1})", 400, "frobnicate", "unknown_parameter"},
      {"unknown_model", "POST", c, R"({"prompt": "hi", "model": "gpt-5"})", 400, "model", "model_not_found"},
      {"chat_missing_messages", "POST", chat, R"({"max_tokens": 4})", 400, "messages", "missing_required_parameter"},
      {"chat_empty_messages", "POST", chat, R"({"messages": []})", 400, "messages", "invalid_value"},
      {"chat_bad_role", "POST", chat, R"({"messages": [{"role": "robot", "content": "hi"}]})", 400,
       "messages[0].role", "invalid_value"},
      {"chat_content_wrong_type", "POST", chat, R"({"messages": [{"role": "user", "content": 5}]})", 400,
       "messages[0].content", "invalid_type"},
      {"chat_top_logprobs_alone", "POST", chat, "{" + msg + R"(, "top_logprobs": 2})", 400, "top_logprobs",
       "invalid_value"},
      {"chat_tools", "POST", chat, "{" + msg + R"(, "tools": [{"type": "function"}]})", 400, "tools[0].function",
       "missing_required_parameter"},
      {"chat_max_completion_tokens_past_context", "POST", chat, "{" + msg + R"(, "max_completion_tokens": 100000})",
       400, "max_completion_tokens", "context_length_exceeded"},
      // Unterminated 60 KB string: the error quotes a little of it, not the whole body.
      {"malformed_json_long", "POST", c, R"({"prompt": ")" + std::string(60000, 'a'), 400, nullptr, "invalid_json"},
      {"tokenize_prompt_and_messages", "POST", "/tokenize", "{" + msg + R"(, "prompt": "hi"})", 400, "messages",
       "invalid_value"},
      {"tokenize_nothing", "POST", "/tokenize", R"({"add_special_tokens": true})", 400, "prompt",
       "missing_required_parameter"},
      {"tokenize_unknown_field", "POST", "/tokenize", R"({"prompt": "hi", "stream": true})", 400, "stream",
       "unknown_parameter"},
      {"detokenize_outside_vocab", "POST", "/detokenize", R"({"tokens": [1, 99999]})", 400, "tokens", "invalid_value"},
      {"detokenize_not_ids", "POST", "/detokenize", R"({"tokens": "hi"})", 400, "tokens", "invalid_type"},
      {"detokenize_unknown_model", "POST", "/detokenize", R"({"tokens": [1], "model": "gpt-5"})", 400, "model",
       "model_not_found"},
      {"tokenize_wrong_method", "GET", "/tokenize", "", 405, nullptr, "method_not_allowed"},
      {"model_by_id_wrong_method", "POST", "/v1/models/stories260K-f32", "{}", 405, nullptr, "method_not_allowed"},
      {"wrong_method", "GET", c, "", 405, nullptr, "method_not_allowed"},
      {"unknown_route", "GET", "/v1/engines", "", 404, nullptr, "not_found"},
      {"unknown_route_post", "POST", "/v2/completions", R"({"prompt": "hi"})", 404, nullptr, "not_found"},
      {"body_too_large", "POST", c, json({{"prompt", std::string(70000, 'a')}}).dump(), 413, nullptr,
       "request_too_large"},
  };
}

class ServeBadRequest : public ::testing::TestWithParam<BadRequest> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    server_ = new ServerProcess({"-p", test::serve_pipeline(*dir_, "  max_body_bytes: 64KiB\n")});
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static ServerProcess* server_;
};
test::TempDir* ServeBadRequest::dir_ = nullptr;
ServerProcess* ServeBadRequest::server_ = nullptr;

TEST_P(ServeBadRequest, GetsItsStatusAndAnErrorNamingTheField) {
  const BadRequest& b = GetParam();
  auto c = server_->client();
  auto res = b.method == "GET" ? c.Get(b.path.c_str()) : c.Post(b.path.c_str(), b.body, "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, b.status) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const json j = json::parse(res->body);
  ASSERT_TRUE(j.contains("error")) << res->body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_EQ(j["error"]["param"], b.param) << res->body;
  EXPECT_EQ(j["error"]["code"], b.code) << res->body;
  EXPECT_LT(res->body.size(), 2000u) << "an error names the problem; it does not echo the request";
  // The server is still fine afterwards.
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

INSTANTIATE_TEST_SUITE_P(Table, ServeBadRequest, ::testing::ValuesIn(bad_requests()),
                         [](const auto& info) { return info.param.name; });

TEST(ServeBadRequests, TheTableHasAtLeastFifteenRows) { EXPECT_GE(bad_requests().size(), 15u); }

// --- Auth, back-pressure, disconnects, shutdown ---

TEST(ServeAuth, ApiKeyIsRequiredOnEveryRouteButHealth) {
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir), "--api-key", "s3cret"});
  auto c = server.client();
  for (const char* path : {"/v1/models", "/metrics"}) {
    auto res = c.Get(path);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << path;
    EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
  }
  auto none = c.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  auto wrong = c.Post("/v1/completions", {{"Authorization", "Bearer s3cre"}}, R"({"prompt": "hi", "max_tokens": 2})",
                      "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto right = c.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}}, R"({"prompt": "hi", "max_tokens": 2})",
                      "application/json");
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  // The scheme's name in any case (RFC 9110); the key itself is case-sensitive.
  auto lower = c.Post("/v1/completions", {{"Authorization", "bearer s3cret"}}, R"({"prompt": "hi", "max_tokens": 2})",
                      "application/json");
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->status, 200) << lower->body;
  auto key_case = c.Post("/v1/completions", {{"Authorization", "Bearer S3CRET"}}, R"({"prompt": "hi", "max_tokens": 2})",
                         "application/json");
  ASSERT_TRUE(key_case);
  EXPECT_EQ(key_case->status, 401);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // The key is checked before anything about the request is answered.
  test::RawConnection raw(server.port());
  raw.send_raw("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_NE(raw.read_until("}", std::chrono::seconds(10)).find("HTTP/1.1 401"), std::string::npos);
}

TEST(ServeAuth, KeyFileFromThePipelineYaml) {
  test::TempDir dir;
  dir.write("key.txt", "from-file\n");
  ServerProcess server({"-p", test::serve_pipeline(dir, "  api_key_file: key.txt\n")});
  auto c = server.client();
  auto res = c.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  c.set_bearer_token_auth("from-file");
  res = c.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

// #51 item 9: `user` is the client's word; with user_from_key it is derived from the key, so a
// client holding one key cannot claim another key's user to probe its cache through cached_tokens.
TEST(ServeAuth, NamedKeysAndUserFromKeyIsolateEachKeysCache) {
  test::TempDir dir;
  dir.write("keys.txt", "# team keys\nteam-a secret-a\n\nteam-b secret-b\n");
  const std::string pipeline = dir.write(
      "prefix.yaml", "extends: " + std::string(TESSERA_SOURCE_DIR) + "/pipelines/prefix.yaml\nmodel: " +
                         test::kStoriesF32 + "\nbackend: cpu\ncomponents:\n  cache: { plugin: prefix_lru, isolation: user }\n" +
                         "server:\n  api_key_file: keys.txt\n  user_from_key: true\n");
  ServerProcess server({"-p", pipeline});
  auto a = server.client();
  a.set_bearer_token_auth("secret-a");
  auto b = server.client();
  b.set_bearer_token_auth("secret-b");
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big red ball under a tree.";
  auto ask = [&](httplib::Client& c, const std::string& user) {
    return post_json(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}, {"user", user}});
  };
  auto cached = [](const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(); };
  EXPECT_EQ(cached(ask(a, "bob")), 0);
  EXPECT_GE(cached(ask(a, "bob")), 16);          // team-a/bob's own blocks
  EXPECT_EQ(cached(ask(b, "bob")), 0);           // team-b/bob is someone else
  EXPECT_EQ(cached(ask(b, "team-a/bob")), 0);    // and cannot claim team-a's user
  auto page = a.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_TRUE(test::metric(page->body, R"(tessera_user_requests_total{user="team-a/bob",status="200"})").has_value())
      << page->body;
}

}  // namespace
}  // namespace tessera
