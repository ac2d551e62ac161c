// `tessera serve`: the OpenAI-compatible HTTP API, on the Boost.Beast transport (http_transport.h).
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true answers with SSE chunks, then [DONE])
//   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)
//
// With an API key, every route but /health needs `Authorization: Bearer KEY` (401 otherwise; health
// probes carry no key). Bad input gets an OpenAI-style JSON error naming the field, never a 500:
// 400 (malformed JSON, wrong types, out-of-range values, prompts longer than the context), 404
// (unknown route or model), 405, 413 (body over max_body_bytes), 429 with Retry-After (max_queue
// requests in the server already; or more than max_connections_per_client connections), 408 (a
// request not in within request_deadline), 503 while shutting down. A client that disconnects
// cancels its request, queued or running, streaming or not, which frees its KV blocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "deployment.h"
#include "openai_request.h"
#include "metrics.h"
#include "serving_engine.h"
#include "http_transport.h"
#include "tessera/pipeline.h"

namespace tessera::serve {

// Worker threads beyond max_queue (server.http_threads >= max_queue + this): they answer refusals
// (429, 503) and /tokenize while max_queue requests are generating (/health and /metrics are
// answered on the I/O threads).
inline constexpr int64_t kSpareHttpThreads = 8;

// A client's key: `name` says who it is in the logs, and under user_from_key in cache isolation.
struct ApiKey {
  std::string name;
  std::string secret;
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<ApiKey> api_keys;  // empty = no key
  // Derive the request's user (prefix-cache namespace, per-user metrics) from the key it
  // authenticated with — "NAME", or "NAME/USER" when the request names a user — so that no client
  // can claim another key's user and probe its cache through cached_tokens.
  bool user_from_key = false;
  int64_t max_queue = 256;
  int64_t max_body_bytes = 1 << 20;
  double shutdown_deadline = 10;  // seconds
  int64_t http_threads = 264;
  double request_deadline = 30;  // seconds for one request's headers and body
  int64_t max_connections_per_client = 512;
  int64_t default_max_tokens = 256;
  // The admin API's key (`Authorization: Bearer KEY` on /admin/*); empty: the admin API is off (403).
  std::string admin_key;
  std::string chat_template = "auto";  // see ChatTemplate::choose
};

class HttpServer {
 public:
  // Builds the deployment again from its file, for a reload; throws Error (file:line) when it cannot.
  using Reloader = std::function<std::shared_ptr<Deployment>()>;
  HttpServer(std::shared_ptr<Deployment> deployment, ServerConfig config, Reloader reloader = {});
  ~HttpServer();

  // Binds host:port (port 0 picks a free one) and returns the port; throws Error when it cannot.
  int bind();
  // Serves until shutdown() has finished.
  void run();
  // Graceful stop, from any thread: new requests get 503, in-flight ones may finish until the deadline,
  // then the rest are cancelled; then the listener stops, and shutdown() returns once run() has.
  void shutdown();
  // Reads the deployment file again (SIGHUP, POST /admin/reload): the new pipelines load beside the
  // old ones, new requests go to them, and the old ones finish their requests and unload. Returns the
  // new deployment's description; throws Error (and keeps the old one serving) on a bad file.
  std::string reload();
  // Cancels every request in flight, in every deployment still serving (a second signal).
  void cancel_all();

 private:
  struct Stream;
  class Admission;
  std::optional<HttpResponse> on_head(const HttpRequest& req);
  const ApiKey* authenticated_key(const HttpRequest& req) const;  // nullptr: none, or a wrong one
  std::optional<HttpResponse> handle(const HttpRequest& req, HttpConnection& conn);
  HttpResponse get_route_answer(const HttpRequest& req);
  std::optional<HttpResponse> generate(Endpoint endpoint, const HttpRequest& req, HttpConnection& conn);
  std::shared_ptr<Deployment> current() const;
  std::optional<HttpResponse> admin_on_head(const HttpRequest& req);
  HttpResponse admin(const HttpRequest& req);
  GenerationRequest build_request(const OpenAiRequest& r, const Variant& v) const;
  // The variant serving a request that names `model` for `user`; ApiError 400 for an unknown model.
  static Variant& variant_for(const Deployment& d, const std::string& model, const std::string& user);
  nlohmann::json model_json(const ServedModel& m) const;
  nlohmann::json tokenize(const TokenizeRequest& r) const;
  nlohmann::json detokenize(const DetokenizeRequest& r) const;
  void stream(Stream& st, HttpConnection& conn);
  bool try_admit();
  void leave();

  mutable std::mutex deployment_mutex_;
  std::shared_ptr<Deployment> deployment_;             // guarded by deployment_mutex_
  std::vector<std::weak_ptr<Deployment>> retired_;     // replaced by reloads, maybe still draining
  Reloader reloader_;
  std::mutex reload_mutex_;                            // one reload at a time
  ServerConfig config_;
  ServerMetrics metrics_;
  std::unique_ptr<HttpTransport> transport_;
  int64_t started_ = 0;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> next_response_id_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> run_returned_{false};
  std::mutex drain_mutex_;
  std::condition_variable drain_cv_;
};

}  // namespace tessera::serve
