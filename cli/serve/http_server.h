// `tessera serve`: the OpenAI-compatible HTTP API on cpp-httplib.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true answers with SSE chunks, then [DONE])
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)
//
// With an API key, every route but /health needs `Authorization: Bearer KEY` (401 otherwise; health
// probes carry no key). Bad input gets an OpenAI-style JSON error naming the field, never a 500:
// 400 (malformed JSON, wrong types, out-of-range values, prompts longer than the context), 404
// (unknown route or model), 405, 413 (body over max_body_bytes), 429 with Retry-After (max_queue
// requests in the server already), 503 while shutting down. A streaming client that disconnects
// cancels its request, which frees its KV blocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "openai_request.h"
#include "metrics.h"
#include "serving_engine.h"
#include "tessera/pipeline.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tessera::serve {

// HTTP threads beyond max_queue (server.http_threads >= max_queue + this): they answer /health,
// /metrics and refusals while max_queue requests are generating.
inline constexpr int64_t kSpareHttpThreads = 8;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // empty = no key
  int64_t max_queue = 256;
  int64_t max_body_bytes = 1 << 20;
  double shutdown_deadline = 10;  // seconds
  int64_t http_threads = 264;
  std::string model_name;  // the id clients send as "model"
  int64_t default_max_tokens = 256;
  std::string chat_template = "auto";  // see ChatTemplate::choose
};

class HttpServer {
 public:
  HttpServer(Pipeline& pipeline, ServingEngine& engine, ChatTemplate chat, ServerConfig config);
  ~HttpServer();

  // Binds host:port (port 0 picks a free one) and returns the port; throws Error when it cannot.
  int bind();
  // Serves until shutdown() has finished.
  void run();
  // Graceful stop, from any thread: new requests get 503, in-flight ones may finish until the deadline,
  // then the rest are cancelled; then the listener stops, and shutdown() returns once run() has.
  void shutdown();

 private:
  struct Stream;
  class Admission;
  void routes();
  void generate(Endpoint endpoint, const std::string& body, const httplib::Request& req, httplib::Response& res);
  GenerationRequest build_request(const OpenAiRequest& r) const;
  void check_model(const std::string& model) const;
  nlohmann::json tokenize(const TokenizeRequest& r) const;
  nlohmann::json detokenize(const DetokenizeRequest& r) const;
  void start_stream(std::shared_ptr<Stream> st, httplib::Response& res);
  bool try_admit();
  void leave();

  Pipeline& pipeline_;
  ServingEngine& engine_;
  ChatTemplate chat_;
  ServerConfig config_;
  ServerMetrics metrics_;
  std::unique_ptr<httplib::Server> svr_;
  int64_t started_ = 0;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> run_returned_{false};
  std::mutex drain_mutex_;
  std::condition_variable drain_cv_;
};

}  // namespace tessera::serve
