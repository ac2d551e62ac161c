#include "http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <iostream>
#include <functional>
#include <random>
#include <span>
#include <thread>

#include "api_error.h"
#include "openai_response.h"
#include "peer_socket.h"
#include "tessera/error.h"

namespace tessera::serve {

using nlohmann::json;

namespace {

// A text prompt's ids as a generation starts from them (/tokenize reports the same): BOS and EOS
// where the vocabulary asks for them, and BOS alone for an empty text that gives no token.
std::vector<int32_t> prompt_ids(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.encode(text, true);
  if (ids.empty() && tok.bos() >= 0) ids.push_back(tok.bos());
  return ids;
}

// Routes by method (the others get 405 naming the right one), and all of them for the metrics.
const char* const kPostRoutes[] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
const char* const kGetRoutes[] = {"/v1/models", "/health", "/metrics"};

bool one_of(const std::string& path, std::span<const char* const> routes) {
  return std::any_of(routes.begin(), routes.end(), [&](const char* r) { return path == r; });
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status() == 429) res.set_header("Retry-After", "1");
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  send_json(res, e.status(), e.body());
}

// Compares in time that does not depend on where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string route_label(const std::string& path) {
  if (one_of(path, kPostRoutes) || one_of(path, kGetRoutes)) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "unmatched";  // unknown paths share one label: clients cannot grow the metrics page
}

}  // namespace

// One streaming response: the state its content provider keeps between calls.
struct HttpServer::Stream {
  std::shared_ptr<RequestHandle> handle;
  OpenAiRequest request;
  ResponseMeta meta;
  std::string pending;  // text not yet sent (an unfinished UTF-8 sequence)
  bool role_sent = false;
  bool finished = false;  // the last chunk and [DONE] went out
  bool observed = false;  // its result is in the metrics
};

HttpServer::HttpServer(Pipeline& pipeline, ServingEngine& engine, ChatTemplate chat, ServerConfig config)
    : pipeline_(pipeline), engine_(engine), chat_(chat), config_(std::move(config)),
      svr_(std::make_unique<httplib::Server>()), started_(int64_t(std::time(nullptr))) {
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  // httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once overflows it and
  // the kernel resets the surplus connections. Linux lets listen() be called again to enlarge it.
  // Not httplib's default options: they add SO_REUSEPORT, with which a second server binds the same
  // port and the kernel splits the connections between the two.
  int listen_fd = -1;
  svr_->set_socket_options([&listen_fd](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = sock;
  });
  int port = config_.port;
  if (config_.port == 0) {
    port = svr_->bind_to_any_port(config_.host);
    if (port <= 0) throw Error("cannot bind to " + config_.host + " on any port");
  } else if (!svr_->bind_to_port(config_.host, config_.port)) {
    throw Error("cannot bind to " + config_.host + ":" + std::to_string(config_.port) +
                " (in use, or not an address of this machine)");
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  return port;
}

void HttpServer::run() {
  if (!draining_) svr_->listen_after_bind();
  run_returned_ = true;
}

void HttpServer::shutdown() {
  if (draining_.exchange(true)) return;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.shutdown_deadline));
  std::unique_lock lock(drain_mutex_);
  if (!drain_cv_.wait_until(lock, deadline, [&] { return in_flight_ == 0; })) {
    std::cerr << "shutdown: deadline passed with " << in_flight_ << " request(s) in flight; cancelling them\n";
    engine_.cancel_all();
    // Cancelled requests answer at once (503, or an error event on a stream); a stream whose client
    // stopped reading ends at the write timeout.
    drain_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return in_flight_ == 0; });
  }
  lock.unlock();
  // httplib's stop() does nothing before listen_after_bind has started its loop, which a signal
  // during start-up precedes (the server then listened on, answering 503, until killed): stop it
  // once it runs, and return when run() has.
  bool stopped = false;
  while (!run_returned_) {
    if (!stopped && svr_->is_running()) {
      svr_->stop();
      stopped = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool HttpServer::try_admit() {
  int64_t n = in_flight_.load();
  while (n < config_.max_queue) {
    if (in_flight_.compare_exchange_weak(n, n + 1)) return true;
  }
  return false;
}

void HttpServer::leave() {
  {
    std::lock_guard lock(drain_mutex_);
    --in_flight_;
  }
  drain_cv_.notify_all();
}

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  s.new_task_queue = [n = config_.http_threads] { return new httplib::ThreadPool(size_t(n)); };
  s.set_payload_max_length(size_t(config_.max_body_bytes));
  s.set_keep_alive_max_count(1000);
  s.set_keep_alive_timeout(2);  // idle connections must not hold up a shutdown for long
  s.set_read_timeout(30);
  s.set_write_timeout(10);
  s.set_tcp_nodelay(true);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!config_.api_key.empty() && req.path != "/health") {
      const std::string auth = req.get_header_value("Authorization");
      // The scheme's name is case-insensitive (RFC 9110 11.1), the key is not.
      const std::string scheme = "bearer ";
      const bool bearer = auth.size() >= scheme.size() &&
                          std::equal(scheme.begin(), scheme.end(), auth.begin(),
                                     [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
      if (!bearer || !same_secret(auth.substr(scheme.size()), config_.api_key)) {
        send_error(res, ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'", "",
                                 "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // httplib reads a body without a length until the connection closes (the read timeout, for a
    // client waiting on its answer): a request that has no length has no body, so say so at once.
    // Framing two parties could read differently (RFC 9112 6.3: request smuggling through a proxy)
    // is refused, and the connection closed: where this body ends is not known.
    const size_t lengths = req.get_header_value_count("Content-Length");
    if (lengths > 1 || (lengths == 1 && req.has_header("Transfer-Encoding"))) {
      res.set_header("Connection", "close");
      send_error(res, ApiError(400, lengths > 1 ? "more than one Content-Length header"
                                                : "both Content-Length and Transfer-Encoding headers",
                               "", "invalid_request"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE") {
      const std::string length = req.get_header_value("Content-Length");
      const bool digits = !length.empty() && length.size() <= 18 &&
                          std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!length.empty() && !digits) {
        send_error(res, ApiError(400, "invalid Content-Length '" + length + "'", "", "invalid_request"));
        return httplib::Server::HandlerResponse::Handled;
      }
      const bool chunked = req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
      if (length.empty() && !chunked) {
        // Answered here as routing would, since routing would first wait for the body.
        const bool post_route = one_of(req.path, kPostRoutes);
        const bool get_route = one_of(req.path, kGetRoutes) || req.path.rfind("/v1/models/", 0) == 0;
        if (req.method == "POST" && post_route) {
          send_error(res, ApiError(400, "POST " + req.path + " without a body: send one with Content-Length or "
                                        "Transfer-Encoding: chunked", "", "invalid_request"));
        } else if (post_route || get_route) {
          const std::string allow = post_route ? "POST" : "GET";
          res.set_header("Allow", allow);
          send_error(res, ApiError(405, req.method + " is not allowed on " + req.path + "; use " + allow, "",
                                   "method_not_allowed"));
        } else {
          send_error(res, ApiError(404, "no route for " + req.method + " " + req.path, "", "not_found"));
        }
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Bodies through a content reader, held to server.max_body_bytes whatever their framing (httplib
  // caps bodies sent as form data, what `curl -d` declares, at 8 KiB, and chunked ones not at all).
  using BodyHandler = std::function<void(const std::string& body, const httplib::Request&, httplib::Response&)>;
  auto post = [this](BodyHandler handle) {
    return [this, handle](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      if (req.is_multipart_form_data()) {
        send_error(res, ApiError(415, "multipart form data is not accepted: send the request as JSON "
                                      "(Content-Type: application/json)", "", "unsupported_media_type"));
        return;
      }
      // Past the limit the rest is read and dropped, up to four times the limit, so that the client
      // finishes sending and reads the 413: closing with its bytes unread resets the connection,
      // and the client then sees a broken pipe instead of the answer.
      std::string body;
      bool too_large = false;
      size_t seen = 0;
      const size_t limit = size_t(config_.max_body_bytes);
      const bool whole = read([&](const char* data, size_t n) {
        seen += n;
        too_large = too_large || seen > limit;
        if (!too_large) body.append(data, n);
        return seen <= 4 * limit;
      });
      if (too_large) {
        res.status = 413;  // the error handler words it
        return;
      }
      if (!whole) return;  // cut off or unreadable: httplib set the status, the error handler answers
      handle(body, req, res);
    };
  };
  auto generation = [this, &post](Endpoint endpoint) {
    return post([this, endpoint](const std::string& body, const httplib::Request& req, httplib::Response& res) {
      generate(endpoint, body, req, res);
    });
  };
  s.Post("/v1/completions", generation(Endpoint::completions));
  s.Post("/v1/chat/completions", generation(Endpoint::chat));
  s.Post("/tokenize", post([this](const std::string& body, const httplib::Request&, httplib::Response& res) {
    try {
      send_json(res, 200, tokenize(parse_tokenize_request(body)));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }));
  s.Post("/detokenize", post([this](const std::string& body, const httplib::Request&, httplib::Response& res) {
    try {
      send_json(res, 200, detokenize(parse_detokenize_request(body)));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }));

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", config_.model_name}, {"object", "model"}, {"created", started_},
                        {"owned_by", "tessera"}, {"max_model_len", pipeline_.max_sequence_tokens()},
                        {"chat_template", chat_.describe()}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != config_.model_name) {
      send_error(res, ApiError(404, "model '" + id + "' does not exist; this server serves '" + config_.model_name + "'",
                               "model", "model_not_found"));
      return;
    }
    send_json(res, 200, {{"id", id}, {"object", "model"}, {"created", started_}, {"owned_by", "tessera"},
                         {"max_model_len", pipeline_.max_sequence_tokens()}, {"chat_template", chat_.describe()}});
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const std::string failure = engine_.failure();
    if (!failure.empty()) {
      send_json(res, 503, {{"status", "failed"}, {"error", failure}});
    } else if (draining_) {
      send_json(res, 503, {{"status", "shutting_down"}});
    } else {
      send_json(res, 200, {{"status", "ok"}, {"model", config_.model_name}});
    }
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(metrics_.render(engine_.snapshot(), in_flight_, pipeline_.decoder().speculator() != nullptr), "text/plain; version=0.0.4; charset=utf-8");
  });

  // Known routes with the wrong method: 405 naming the allowed one.
  auto not_allowed = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      send_error(res, ApiError(405, req.method + " is not allowed on " + req.path + "; use " + allow, "",
                               "method_not_allowed"));
    };
  };
  for (const char* path : kPostRoutes) {
    s.Get(path, not_allowed("POST"));
    s.Put(path, not_allowed("POST"));
    s.Delete(path, not_allowed("POST"));
    s.Patch(path, not_allowed("POST"));
  }
  auto get_only = [&](const char* path) {
    s.Post(path, httplib::Server::Handler(not_allowed("GET")));
    s.Put(path, httplib::Server::Handler(not_allowed("GET")));
    s.Delete(path, httplib::Server::Handler(not_allowed("GET")));
    s.Patch(path, httplib::Server::Handler(not_allowed("GET")));
  };
  for (const char* path : kGetRoutes) get_only(path);
  get_only(R"(/v1/models/(.+))");

  // httplib's own refusals (no route, body too large, malformed HTTP) get the same JSON errors.
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                   httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      send_error(res, ApiError(404, "no route for " + req.method + " " + req.path, "", "not_found"));
    } else if (res.status == 413) {
      send_error(res, ApiError(413, "the request body is larger than " + std::to_string(config_.max_body_bytes) +
                                        " bytes (server.max_body_bytes)", "", "request_too_large"));
    } else {
      send_error(res, ApiError(res.status, "the HTTP request could not be read", "", "bad_request"));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::cerr << "error: " << req.method << " " << req.path << ": " << what << "\n";
    send_error(res, ApiError(500, "internal error: " + what, "", "internal_error"));
  });
  // Counted before the response is written (the logger runs after it, when a client may already
  // have read /metrics without this request in it).
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics_.count_http(route_label(req.path), res.status);
  });
}

// The model a request names, if it names one, must be this server's.
void HttpServer::check_model(const std::string& model) const {
  if (!model.empty() && model != config_.model_name) {
    throw ApiError(404, "model '" + model + "' does not exist; this server serves '" + config_.model_name + "'",
                   "model", "model_not_found");
  }
}

json HttpServer::tokenize(const TokenizeRequest& r) const {
  check_model(r.model);
  const Tokenizer& tok = pipeline_.tokenizer();
  const std::string field = r.chat ? "messages" : "prompt";
  std::vector<int32_t> ids;
  try {
    ids = r.chat ? chat_.encode(tok, r.messages) : r.add_special_tokens ? prompt_ids(tok, r.text) : tok.encode(r.text, false);
  } catch (const Error& e) {
    throw bad_field(field, "cannot tokenize '" + field + "': " + e.what());
  }
  return {{"count", ids.size()}, {"max_model_len", pipeline_.max_sequence_tokens()}, {"tokens", ids}};
}

json HttpServer::detokenize(const DetokenizeRequest& r) const {
  check_model(r.model);
  const int64_t vocab = pipeline_.model().config().vocab;
  for (const int32_t t : r.tokens) {
    if (t >= vocab) {
      throw bad_field("tokens", "'tokens' holds token id " + std::to_string(t) + ", outside the vocabulary (0.." +
                                    std::to_string(vocab - 1) + ")");
    }
  }
  return {{"prompt", pipeline_.tokenizer().decode(r.tokens)}};
}

GenerationRequest HttpServer::build_request(const OpenAiRequest& r) const {
  const Tokenizer& tok = pipeline_.tokenizer();
  const ModelConfig& model = pipeline_.model().config();
  const bool chat = r.endpoint == Endpoint::chat;
  const std::string prompt_field = chat ? "messages" : "prompt";
  GenerationRequest g;
  try {
    if (chat) {
      g.prompt = chat_.encode(tok, r.messages);
      g.stop_tokens = chat_.stop_tokens(tok);
      for (const auto& s : chat_.stop_strings(tok)) g.stop.push_back(s);
    } else if (r.prompt_text) {
      g.prompt = prompt_ids(tok, *r.prompt_text);
    } else {
      g.prompt = r.prompt_tokens;
    }
  } catch (const Error& e) {
    throw bad_field(prompt_field, std::string("cannot tokenize '") + prompt_field + "': " + e.what());
  }
  if (g.prompt.empty()) {
    if (tok.bos() < 0) throw bad_field(prompt_field, "'" + prompt_field + "' is empty");
    g.prompt.push_back(tok.bos());  // generate from BOS alone, as `tessera run` does
  }
  for (int32_t t : g.prompt) {
    if (t < 0 || t >= model.vocab) {
      throw bad_field(prompt_field, "'" + prompt_field + "' holds token id " + std::to_string(t) +
                                        ", outside the vocabulary (0.." + std::to_string(model.vocab - 1) + ")");
    }
  }
  const auto n = int64_t(g.prompt.size());
  const int64_t ctx = pipeline_.max_sequence_tokens();
  if (n >= ctx) {
    throw bad_field(prompt_field,
                    "the prompt is " + std::to_string(n) + " tokens; " + pipeline_.sequence_limit_text() +
                        " must also hold at least one generated token",
                    "context_length_exceeded");
  }
  if (r.max_tokens) {
    if (n + *r.max_tokens > ctx) {
      throw bad_field(r.max_tokens_field,
                      "'" + r.max_tokens_field + "' is " + std::to_string(*r.max_tokens) + ", but the prompt is " +
                          std::to_string(n) +
                          " tokens and the limit " + std::to_string(ctx) + " (" + pipeline_.sequence_limit_text() +
                          "): at most " + std::to_string(ctx - n) +
                          " tokens can be generated",
                      "context_length_exceeded");
    }
    g.max_tokens = *r.max_tokens;
  } else {
    g.max_tokens = std::min(config_.default_max_tokens, ctx - n);
  }

  SamplingParams s = pipeline_.decoder().default_params();
  if (r.temperature) s.temperature = *r.temperature;
  if (r.top_p) s.top_p = *r.top_p;
  if (r.top_k) s.top_k = *r.top_k;
  if (r.min_p) s.min_p = *r.min_p;
  if (r.frequency_penalty) s.frequency_penalty = *r.frequency_penalty;
  if (r.presence_penalty) s.presence_penalty = *r.presence_penalty;
  if (r.repetition_penalty) s.repetition_penalty = *r.repetition_penalty;
  if (r.seed) {
    s.seed = *r.seed;
  } else if (s.temperature > 0) {
    // As OpenAI: without a seed, each request samples afresh.
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    s.seed = rng();
  }
  s.logprobs = r.logprobs ? r.top_logprobs : -1;
  try {
    validate_sampling(s);
  } catch (const Error& e) {
    throw bad_field("", e.what());
  }
  g.sampling = s;
  g.user = r.user.empty() ? "anonymous" : r.user;
  for (const auto& stop : r.stop) g.stop.push_back(stop);
  g.ignore_eos = r.ignore_eos;
  g.priority = int32_t(-r.priority);  // the engine's priority runs higher first
  return g;
}

// Holds one of max_queue places; a stream takes it over and gives it back when it ends.
class HttpServer::Admission {
 public:
  explicit Admission(HttpServer& s) : server_(s) {}
  ~Admission() {
    if (held_) server_.leave();
  }
  bool enter() { return held_ = server_.try_admit(); }
  void hand_over() { held_ = false; }

 private:
  HttpServer& server_;
  bool held_ = false;
};

void HttpServer::generate(Endpoint endpoint, const std::string& body, const httplib::Request& req,
                          httplib::Response& res) {
  std::string user;
  Admission admission(*this);
  try {
    if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down", "server_error");
    OpenAiRequest r = parse_openai_request(endpoint, body);
    user = r.user;
    check_model(r.model);
    GenerationRequest g = build_request(r);
    if (!admission.enter()) {
      throw ApiError(429, "the server is at capacity (" + std::to_string(config_.max_queue) +
                              " requests in flight); retry later", "", "queue_full");
    }
    std::shared_ptr<RequestHandle> handle;
    try {
      handle = engine_.submit(std::move(g));
    } catch (const Error& e) {
      if (draining_ || !engine_.failure().empty()) throw ApiError(503, e.what(), "", "unavailable", "server_error");
      throw bad_field("", e.what());
    }
    ResponseMeta meta{endpoint, (endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-") + std::to_string(handle->id()),
                      int64_t(std::time(nullptr)), config_.model_name};
    if (r.stream) {
      auto st = std::make_shared<Stream>();
      st->handle = std::move(handle);
      st->request = std::move(r);
      st->meta = std::move(meta);
      admission.hand_over();  // the stream's releaser leaves
      start_stream(std::move(st), res);
      return;
    }

    std::string text;
    std::optional<GenerationResult> result;
    const int connection = connection_socket(req.local_port, req.remote_addr, req.remote_port);
    bool gone = false;  // the client closed its connection: nobody to answer
    while (!result) {
      if (!gone && (connection == kConnectionReset || (connection >= 0 && peer_closed(connection)))) {
        gone = true;
        engine_.cancel(handle->id());
      }
      handle->wait(std::chrono::milliseconds(50), text, result);
    }
    metrics_.observe(user, *result);
    if (gone) {
      res.status = 499;  // nginx's "client closed request", for the route's count; nobody reads it
      metrics_.count_user(user, 499);
      return;
    }
    if (result->reason == FinishReason::error) {
      if (!engine_.failure().empty()) throw ApiError(500, result->error, "", "internal_error");
      if (result->model_fault) throw ApiError(500, result->error, "", "generation_failed", "server_error");
      throw bad_field("", result->error, "generation_failed");
    }
    if (result->reason == FinishReason::cancelled) {
      throw ApiError(503, "the request was cancelled: the server is shutting down", "", "cancelled", "server_error");
    }
    send_json(res, 200, response_json(meta, *result, r, pipeline_.tokenizer()));
    metrics_.count_user(user, 200);
  } catch (const ApiError& e) {
    send_error(res, e);
    metrics_.count_user(user, e.status());
  }
}

void HttpServer::start_stream(std::shared_ptr<Stream> st, httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) -> bool {
        auto send = [&](const json& j) {
          const std::string ev = sse_event(j);
          return sink.write(ev.data(), ev.size());
        };
        if (st->meta.endpoint == Endpoint::chat && !st->role_sent) {
          st->role_sent = true;
          if (!send(chunk_json(st->meta, "", "assistant"))) return false;
        }
        std::string text;
        std::optional<GenerationResult> result;
        st->handle->wait(std::chrono::milliseconds(50), text, result);
        st->pending += text;
        if (!result) {
          const size_t n = complete_utf8_prefix(st->pending);
          if (n > 0) {
            const bool ok = send(chunk_json(st->meta, st->pending.substr(0, n)));
            st->pending.erase(0, n);
            if (!ok) return false;
          }
          return true;  // httplib checks the socket before calling again: a gone client ends the stream
        }
        metrics_.observe(st->request.user, *result);
        st->observed = true;
        if (!st->pending.empty() && !send(chunk_json(st->meta, st->pending))) return false;
        if (result->reason == FinishReason::error || result->reason == FinishReason::cancelled) {
          const ApiError e = result->reason == FinishReason::cancelled
                                 ? ApiError(503, "the request was cancelled: the server is shutting down", "",
                                            "cancelled", "server_error")
                                 : ApiError(500, result->error, "", "generation_failed", "server_error");
          if (!send(e.body())) return false;
        } else {
          json last = chunk_json(st->meta, "", nullptr, openai_finish_reason(result->reason));
          // Usage rides on the last chunk, or with include_usage in OpenAI's separate usage chunk
          // alone: once, for clients that add up the usage of every chunk.
          if (st->request.include_usage) {
            if (!send(last) || !send(usage_chunk_json(st->meta, *result))) return false;
          } else {
            last["usage"] = usage_json(*result);
            if (!send(last)) return false;
          }
        }
        static const std::string done = "data: [DONE]\n\n";
        if (!sink.write(done.data(), done.size())) return false;
        st->finished = true;
        sink.done();
        return true;
      },
      [this, st](bool success) {
        // Called when the response is over: a client that went away cancels its request, which
        // gives its KV blocks back.
        if (!success || !st->finished) engine_.cancel(st->handle->id());
        // A stream cut short still counts its tokens and first-token time; the cancelled result
        // comes within a step.
        std::string text;
        std::optional<GenerationResult> result;
        for (int i = 0; i < 100 && !st->observed && !result; ++i) {
          st->handle->wait(std::chrono::milliseconds(50), text, result);
        }
        if (result) metrics_.observe(st->request.user, *result);
        metrics_.count_user(st->request.user, st->finished ? 200 : 499);
        leave();
      });
}

}  // namespace tessera::serve
