// `tessera serve` against clients that misbehave, on loopback (issue #51): slow and stalled
// clients, a huge declared length, a trickling client at SIGTERM, a queued stream whose client
// leaves, half-closed and pipelined connections.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;
using Clock = std::chrono::steady_clock;

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw Error("connect failed");
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != ssize_t(bytes.size())) throw Error("send failed");
}

// Reads until the server closes the connection (or the timeout); `closed` says which.
std::string read_to_eof(int fd, std::chrono::milliseconds timeout, bool* closed = nullptr) {
  const auto deadline = Clock::now() + timeout;
  std::string text;
  if (closed) *closed = false;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    text.append(buf, size_t(n));
  }
  return text;
}

// GET /health on a fresh connection: the seconds until its answer (a large number if none).
double health_seconds(const ServerProcess& server) {
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(10);
  const auto t0 = Clock::now();
  auto res = c.Get("/health");
  if (!res || res->status != 200) return 1e9;
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ServeHostile, SlowClientsNeitherStarveHealthNorOutliveTheRequestDeadline) {
  // More trickling and stalled connections than HTTP threads (12): /health still answers at once,
  // and each slow one gets 408 and is closed at the 2 s deadline, however it keeps sending.
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir, "  max_queue: 4\n  http_threads: 12\n  request_deadline: 2\n")});
  std::vector<int> slow;
  const auto t0 = Clock::now();
  for (int i = 0; i < 40; ++i) {
    slow.push_back(connect_to(server.port()));
    if (i % 2 == 0) {
      send_all(slow.back(), "G");  // headers, a byte at a time
    } else {
      send_all(slow.back(), "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");  // stalls
    }
  }
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    const std::string rest = "ET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ";
    for (size_t k = 0; trickling; ++k) {
      for (size_t i = 0; i < slow.size(); i += 2) ::send(slow[i], k < rest.size() ? &rest[k] : "a", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(health_seconds(server), 1.0);
  auto metrics = server.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  for (const int fd : slow) {
    bool closed = false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t0 + std::chrono::seconds(6) - Clock::now());
    const std::string reply = read_to_eof(fd, std::max(left, std::chrono::milliseconds(0)), &closed);
    EXPECT_TRUE(closed) << "still open after " << std::chrono::duration<double>(Clock::now() - t0).count() << " s";
    EXPECT_NE(reply.find("HTTP/1.1 408"), std::string::npos) << reply;
    EXPECT_NE(reply.find("request_deadline"), std::string::npos) << reply;
  }
  // Closed at the deadline, not at the end of the trickle or at a per-read timeout.
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(4500));
  trickling = false;
  trickle.join();
  for (const int fd : slow) close(fd);
  EXPECT_LT(health_seconds(server), 1.0);
}

TEST(ServeHostile, ConnectionsPerClientAddressAreCapped) {
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir, "  max_connections_per_client: 3\n")});
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(connect_to(server.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted
  const int extra = connect_to(server.port());
  send_all(extra, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string refused = read_to_eof(extra, std::chrono::seconds(5));
  close(extra);
  EXPECT_NE(refused.find("HTTP/1.1 429"), std::string::npos) << refused;
  EXPECT_NE(refused.find("too_many_connections"), std::string::npos) << refused;
  EXPECT_NE(refused.find("max_connections_per_client 3"), std::string::npos) << refused;
  // A place freed is a place taken.
  close(idle.back());
  idle.pop_back();
  double seconds = 1e9;
  for (int i = 0; i < 50 && seconds > 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seconds = health_seconds(server);
  }
  EXPECT_LT(seconds, 1.0);
  for (const int fd : idle) close(fd);
}

TEST(ServeHostile, AHugeDeclaredLengthGets413AtOnce) {
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir)});
  const int fd = connect_to(server.port());
  const auto t0 = Clock::now();
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: 999999999999999999\r\n\r\n{}");
  const std::string reply = read_to_eof(fd, std::chrono::seconds(5));
  close(fd);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
  EXPECT_NE(reply.find("HTTP/1.1 413"), std::string::npos) << reply;
  EXPECT_NE(reply.find("server.max_body_bytes"), std::string::npos) << reply;
}

TEST(ServeHostile, SigtermHoldsItsDeadlineAgainstATricklingClient) {
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir, "  shutdown_deadline: 1\n  request_deadline: 60\n")});
  const int fd = connect_to(server.port());
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ";
    for (size_t k = 0; trickling; ++k) {
      ::send(fd, k < request.size() ? &request[k] : "a", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = Clock::now();
  const int status = server.stop(SIGTERM, std::chrono::seconds(15));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  trickling = false;
  trickle.join();
  close(fd);
  EXPECT_EQ(status, 0) << server.log();
  EXPECT_LT(took, 1 + 2.5) << server.log();  // shutdown_deadline + slack
}

TEST(ServeHostile, AQueuedStreamWhoseClientLeavesIsCancelledWhileQueued) {
  // One sequence at a time: the second stream waits behind the first, and its client leaves.
  test::TempDir dir;
  const std::string pipeline = test::slow_serve_pipeline(dir);
  {
    std::ofstream(pipeline, std::ios::app) << "  scheduler: { plugin: continuous, max_batch_tokens: 512, max_seqs: 1 }\n";
  }
  ServerProcess server({"-p", pipeline});
  auto c = server.client();
  auto stream = [](const std::string& user) {
    return json({{"prompt", "Once upon a time"}, {"max_tokens", 1900}, {"ignore_eos", true}, {"stream", true},
                 {"user", user}})
        .dump();
  };
  test::RawConnection busy(server.port());
  busy.post("/v1/completions", stream("busy"));
  busy.read_until("\"text\"");
  {
    test::RawConnection queued(server.port());
    queued.post("/v1/completions", stream("queued"));
    // The gauges follow engine steps, a little behind the tokens a client already has: wait for them.
    const std::string page = test::wait_for_metrics(c, [](const std::string& p) {
      return test::metric(p, "tessera_requests_in_flight") == 2 && test::metric(p, "tessera_requests_running") == 1 &&
             test::metric(p, "tessera_queue_depth") == 1;
    });
    ASSERT_EQ(test::metric(page, "tessera_requests_in_flight"), 2) << page;
    ASSERT_EQ(test::metric(page, "tessera_requests_running"), 1) << page;
    ASSERT_EQ(test::metric(page, "tessera_queue_depth"), 1) << page;
  }  // gone while queued
  const std::string gone = R"(tessera_user_requests_total{user="queued",status="499"})";
  const std::string page = test::wait_for_metrics(
      c,
      [&](const std::string& p) {
        return test::metric(p, gone) == 1 && test::metric(p, "tessera_requests_in_flight") == 1;
      },
      std::chrono::seconds(3));
  EXPECT_EQ(test::metric(page, gone), 1) << page;
  EXPECT_EQ(test::metric(page, "tessera_requests_in_flight"), 1) << page;
  // The busy one is still generating: the queued one was not cancelled by the engine reaching it.
  EXPECT_FALSE(test::metric(page, R"(tessera_user_requests_total{user="busy",status="200"})")) << page;
}

TEST(ServeHostile, AHalfClosedClientGetsItsWholeAnswer) {
  // As `nc -N`: the request, then shutdown(SHUT_WR); the answer still comes, then the close.
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir)});
  struct Case {
    std::string request, expect;
  };
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 12})";
  for (const Case& k : std::vector<Case>{
           {"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", R"("status":"ok")"},
           {"GET /health HTTP/1.0\r\n\r\n", R"("status":"ok")"},
           {"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body,
            "there was a little girl named Lily. She"},
           {"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body,
            "there was a little girl named Lily. She"}}) {
    SCOPED_TRACE(k.request);
    const int fd = connect_to(server.port());
    send_all(fd, k.request);
    shutdown(fd, SHUT_WR);
    bool closed = false;
    const std::string reply = read_to_eof(fd, std::chrono::seconds(10), &closed);
    close(fd);
    EXPECT_TRUE(closed);
    EXPECT_NE(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
    EXPECT_NE(reply.find(k.expect), std::string::npos) << reply;
  }
  auto page = server.client().Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, R"(tessera_http_requests_total{route="/v1/completions",status="200"})"), 2)
      << page->body;
}

TEST(ServeHostile, PipelinedRequestsAreAllAnsweredInOrder) {
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir)});
  const std::string body = R"({"prompt": "Once upon a time"})";
  const int fd = connect_to(server.port());
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
               "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body +
                   "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  bool closed = false;
  const std::string reply = read_to_eof(fd, std::chrono::seconds(10), &closed);
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(count_of(reply, "HTTP/1.1 200"), 3u) << reply;
  const size_t health = reply.find(R"("status":"ok")");
  const size_t tokens = reply.find(R"("tokens":[1,403,407,261,378])");
  const size_t models = reply.find(R"("object":"list")");
  ASSERT_NE(health, std::string::npos) << reply;
  ASSERT_NE(tokens, std::string::npos) << reply;
  ASSERT_NE(models, std::string::npos) << reply;
  EXPECT_LT(health, tokens);
  EXPECT_LT(tokens, models);
}

}  // namespace
}  // namespace tessera
