// `tessera serve` under load and at its edges, over real HTTP on loopback: back-pressure (429), a
// model fault, cancellation when a client goes away, and graceful shutdown.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

// A generation that stays in flight for seconds on the slow model (EOS ignored).
std::string long_stream(int max_tokens = 1500, const std::string& user = "anonymous") {
  return json({{"prompt", "Once upon a time"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", true},
               {"user", user}})
      .dump();
}

TEST(ServeLimits, AModelWhoseLogitsOverflowIsTheServersFault) {
  // Not the request's: a 500 naming the cause, so that clients and monitoring treat it as one.
  test::TempDir dir;
  ServerProcess server({"-m", test::write_overflowing_model(dir)});
  auto c = server.client();
  auto res = c.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 4})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500) << res->body;
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "generation_failed");
  EXPECT_NE(e["message"].get<std::string>().find("logits are not finite"), std::string::npos) << res->body;
}

TEST(ServeLimits, AFullQueueGets429WithRetryAfter) {
  test::TempDir dir;
  ServerProcess server({"-p", test::slow_serve_pipeline(dir, "  max_queue: 1\n")});
  test::RawConnection busy(server.port());
  busy.post("/v1/completions", long_stream());
  busy.read_until("\"text\"");  // in flight, generating
  auto c = server.client();
  auto res = c.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "queue_full");
  EXPECT_EQ(e["type"], "rate_limit_error");
}

// After `user`'s client went away mid-generation: its request counted as 499, cancelled well before
// its 1500 tokens, its blocks back in the pool and what it generated counted.
void expect_cancelled_and_freed(httplib::Client& c, const std::string& user) {
  const std::string gone = R"(tessera_user_requests_total{user=")" + user + R"(",status="499"})";
  const std::string page = test::wait_for_metrics(c, [&](const std::string& p) {
    return test::metric(p, gone) == 1 && test::metric(p, "tessera_requests_running") == 0 &&
           test::metric(p, "tessera_kv_blocks_used") == 0;
  });
  EXPECT_EQ(test::metric(page, gone), 1) << page;
  EXPECT_EQ(test::metric(page, "tessera_kv_blocks_used"), 0) << page;
  EXPECT_EQ(test::metric(page, "tessera_requests_in_flight"), 0) << page;
  EXPECT_LT(test::metric(page, "tessera_engine_decode_tokens_total").value_or(1e9), 1000) << page;
  EXPECT_GE(test::metric(page, R"(tessera_user_generation_tokens_total{user=")" + user + R"("})").value_or(0), 1)
      << page;
}

TEST(ServeLimits, ADisconnectedStreamIsCancelledAndFreesItsBlocks) {
  test::TempDir dir;
  ServerProcess server({"-p", test::slow_serve_pipeline(dir)});
  {
    test::RawConnection conn(server.port());
    conn.post("/v1/completions", long_stream(1500, "quitter"));
    conn.read_until("\"text\"");
  }  // closed after the first chunk
  auto c = server.client();
  expect_cancelled_and_freed(c, "quitter");
}

// A non-streaming request whose client goes away while it generates, by closing its connection
// or by resetting it (a killed client, SO_LINGER 0: the server's socket is left without a peer).
// Nothing is written to a non-streaming client until the end: the server watches its connection
// (an SDK's timeout and retry would otherwise leave the first attempt generating).
void leave_a_non_streaming_request(bool reset, const std::string& user) {
  test::TempDir dir;
  ServerProcess server({"-p", test::slow_serve_pipeline(dir)});
  auto c = server.client();
  test::RawConnection conn(server.port());
  json body = json::parse(long_stream(1500, user));
  body["stream"] = false;
  conn.post("/v1/completions", body.dump());
  test::wait_for_metrics(c, [](const std::string& p) { return test::metric(p, "tessera_requests_running") == 1; });
  if (reset) {
    conn.reset();
  } else {
    conn.close();
  }
  expect_cancelled_and_freed(c, user);
  // The route counts it as nginx does: 499, the client closed the request.
  const std::string route = R"(tessera_http_requests_total{route="/v1/completions",status=)";
  const std::string page = test::wait_for_metrics(
      c, [&](const std::string& p) { return test::metric(p, route + R"("499"})") == 1; });
  EXPECT_EQ(test::metric(page, route + R"("499"})"), 1) << page;
  EXPECT_FALSE(test::metric(page, route + R"("200"})")) << page;
}

TEST(ServeLimits, ADisconnectedNonStreamingRequestIsCancelledToo) { leave_a_non_streaming_request(false, "leaver"); }

TEST(ServeLimits, ANonStreamingRequestWhoseClientResetsIsCancelled) { leave_a_non_streaming_request(true, "resetter"); }

// Streams `n` requests on raw connections; returns them once each is generating.
std::vector<std::unique_ptr<test::RawConnection>> start_streams(int port, int n, int max_tokens) {
  std::vector<std::unique_ptr<test::RawConnection>> conns;
  for (int i = 0; i < n; ++i) {
    conns.push_back(std::make_unique<test::RawConnection>(port));
    conns.back()->post("/v1/completions", long_stream(max_tokens));
  }
  for (auto& c : conns) c->read_until("\"text\"");
  return conns;
}

TEST(ServeLimits, FewerHttpThreadsThanMaxQueueNeedsIsRefusedAtStart) {
  // Requests past the threads would wait unseen in httplib's queue: no 429, not in the metrics.
  test::TempDir dir;
  const std::string path = test::serve_pipeline(dir, "  http_threads: 64\n");
  const test::Output o = test::tessera_cmd("serve --port 0 -p '" + path + "'");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("server: http_threads 64 must be at least max_queue 256 + 8"), std::string::npos) << o.text;
}

TEST(ServeShutdown, SigtermRefusesNewRequestsLetsInFlightOnesFinishAndExitsZero) {
  test::TempDir dir;
  ServerProcess server({"-p", test::slow_serve_pipeline(dir, "  shutdown_deadline: 120\n")});
  auto conns = start_streams(server.port(), 2, 60);
  kill(server.pid(), SIGTERM);
  // While draining: /health says so and new requests get 503.
  auto c = server.client();
  std::shared_ptr<httplib::Response> health;
  for (int i = 0; i < 200; ++i) {
    auto res = c.Get("/health");
    if (res && res->status == 503) {
      health = std::make_shared<httplib::Response>(*res);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(health) << server.log();
  EXPECT_EQ(json::parse(health->body)["status"], "shutting_down");
  auto refused = c.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", "application/json");
  if (refused) {  // or the listener has already closed, which refuses it too
    EXPECT_EQ(refused->status, 503);
    EXPECT_EQ(json::parse(refused->body)["error"]["code"], "shutting_down");
  }
  EXPECT_EQ(server.stop(0, std::chrono::seconds(300)), 0) << server.log();  // signal 0: just wait for the exit
  for (auto& conn : conns) {
    const auto s = test::parse_stream(conn->read_until("data: [DONE]"));
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.finish_reason, "length");
    EXPECT_EQ(s.usage["completion_tokens"], 60);
  }
  EXPECT_NE(server.log().find("SIGTERM"), std::string::npos);
}

// `tessera serve ARGS --port 0` sent `sig` as soon as it blocks the signal for its signal thread,
// which is before it loads the model: the signal waits, and the shutdown starts as the listener
// does. Returns the exit status, or -1 when it has not exited within 20 s (then it is killed).
int signal_during_start_up(const std::vector<std::string>& args, int sig) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    test::exec_serve(args, "1");
  }
  const unsigned long bit = 1ul << (sig - 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (bool blocked = false; !blocked && std::chrono::steady_clock::now() < deadline;) {
    const std::string status = test::read_text("/proc/" + std::to_string(pid) + "/status");
    const size_t at = status.find("SigBlk:");
    blocked = at != std::string::npos && (std::stoul(status.substr(at + 7), nullptr, 16) & bit) != 0;
    if (!blocked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, sig);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

TEST(ServeShutdown, ASignalDuringStartUpStillEndsTheServer) {
  // The server used to stay up, answering 503, until killed: httplib's stop() does nothing before
  // its loop runs, and the shutdown raced the listener's start (on a loaded machine, a quarter of
  // starts; on an idle one the listener mostly won).
  test::TempDir dir;
  const std::string pipeline = test::serve_pipeline(dir);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(signal_during_start_up({"-p", pipeline}, i % 2 == 0 ? SIGTERM : SIGINT), 0) << "start " << i;
  }
}

TEST(ServeShutdown, PastTheDeadlineInFlightRequestsAreCancelledAndExitIsZero) {
  test::TempDir dir;
  ServerProcess server({"-p", test::slow_serve_pipeline(dir, "  shutdown_deadline: 0.2\n")});
  auto conns = start_streams(server.port(), 4, 1500);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
  // Well before the requests could have finished (1500 tokens each).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  for (auto& conn : conns) {
    const auto s = test::parse_stream(conn->read_until("data: [DONE]"));
    EXPECT_TRUE(s.done);  // the stream ends properly, with an error event saying why
    EXPECT_EQ(s.error["code"], "cancelled");
    EXPECT_TRUE(s.finish_reason.empty());
  }
  EXPECT_NE(server.log().find("cancelling"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace tessera
