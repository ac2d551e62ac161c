#include "http_server.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <ctime>
#include <iostream>
#include <random>
#include <span>
#include <thread>

#include "api_error.h"
#include "openai_response.h"
#include "structured_output.h"
#include "tessera/error.h"
#include "tool_calls.h"

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

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = dump_json(body);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.status(), e.body());
  if (e.status() == 429) r.headers.emplace_back("Retry-After", "1");
  if (e.status() == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

HttpResponse not_allowed(const HttpRequest& req, const std::string& allow) {
  HttpResponse r = error_response(ApiError(405, req.method + " is not allowed on " + req.path + "; use " + allow, "",
                                           "method_not_allowed"));
  r.headers.emplace_back("Allow", allow);
  return r;
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
  if (path == "/admin/deployment" || path == "/admin/reload") return path;
  return "unmatched";  // unknown paths share one label: clients cannot grow the metrics page
}

// The error code of the transport's own refusals.
std::string refusal_code(int status) {
  switch (status) {
    case 408: return "request_timeout";
    case 413: return "request_too_large";
    case 429: return "too_many_connections";
    case 431: return "headers_too_large";
    case 500: return "internal_error";
    default: return "bad_request";
  }
}

}  // namespace

// One streaming response's state.
struct HttpServer::Stream {
  std::shared_ptr<Deployment> deployment;  // kept while the stream lasts, across a reload
  Variant* variant = nullptr;
  std::shared_ptr<RequestHandle> handle;
  OpenAiRequest request;
  ResponseMeta meta;
  std::string pending;  // text not yet sent (an unfinished UTF-8 sequence, or a tool call being written)
  // With tools: whether the output is held back as a (possible) tool call until it ends.
  OutputStart hold = OutputStart::text;
  bool finished = false;  // the last chunk and [DONE] went out
  bool observed = false;  // its result is in the metrics
};

HttpServer::HttpServer(std::shared_ptr<Deployment> deployment, ServerConfig config, Reloader reloader)
    : deployment_(std::move(deployment)), reloader_(std::move(reloader)), config_(std::move(config)),
      started_(int64_t(std::time(nullptr))) {
  TransportConfig t;
  t.host = config_.host;
  t.port = config_.port;
  t.request_deadline = config_.request_deadline;
  t.max_connections_per_client = config_.max_connections_per_client;
  t.worker_threads = config_.http_threads;
  t.max_body_bytes = config_.max_body_bytes;
  HttpHandlers h;
  h.on_head = [this](const HttpRequest& req) { return on_head(req); };
  h.handle = [this](const HttpRequest& req, HttpConnection& conn) { return handle(req, conn); };
  h.refuse = [this](int status, const std::string& message, const std::string& path) {
    HttpResponse r = error_response(ApiError(status, message, "", refusal_code(status)));
    metrics_.count_http(route_label(path), status);
    return r;
  };
  transport_ = std::make_unique<HttpTransport>(std::move(t), std::move(h));
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() { return transport_->bind(); }

void HttpServer::run() {
  if (!draining_) transport_->run();
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
    cancel_all();
    // Cancelled requests answer at once (503, or an error event on a stream); a client that does
    // not read its answer is cut off when the connections close.
    drain_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return in_flight_ == 0; });
  }
  lock.unlock();
  // Every connection closes now, whatever its client is doing (one trickling its headers included).
  transport_->stop();
  while (!run_returned_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void HttpServer::cancel_all() {
  std::lock_guard lock(deployment_mutex_);
  deployment_->cancel_all();
  for (const auto& w : retired_) {
    if (auto old = w.lock()) old->cancel_all();
  }
}

std::shared_ptr<Deployment> HttpServer::current() const {
  std::lock_guard lock(deployment_mutex_);
  return deployment_;
}

std::string HttpServer::reload() {
  if (!reloader_) throw Error("this server has no file to reload");
  std::lock_guard one(reload_mutex_);
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Deployment> fresh = reloader_();  // throws: the old deployment keeps serving
  std::shared_ptr<Deployment> old;
  {
    std::lock_guard lock(deployment_mutex_);
    old = std::exchange(deployment_, fresh);
    std::erase_if(retired_, [](const std::weak_ptr<Deployment>& w) { return w.expired(); });
    retired_.push_back(old);
  }
  // The old engines stop when their last request lets go of them (old's last owner may be us).
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "reload: " << fresh->describe() << " (loaded in " << seconds << " s; the previous deployment "
            << (old.use_count() > 1 ? "drains its requests" : "unloads") << ")\n";
  metrics_.count_reload();
  return fresh->describe();
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

const ApiKey* HttpServer::authenticated_key(const HttpRequest& req) const {
  const std::string auth = req.header("Authorization");
  // The scheme's name is case-insensitive (RFC 9110 11.1), the key is not.
  const std::string scheme = "bearer ";
  const bool bearer = auth.size() >= scheme.size() &&
                      std::equal(scheme.begin(), scheme.end(), auth.begin(),
                                 [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
  if (!bearer) return nullptr;
  const std::string sent = auth.substr(scheme.size());
  const ApiKey* found = nullptr;
  for (const ApiKey& k : config_.api_keys) {  // every key compared, whichever matches
    if (same_secret(sent, k.secret)) found = &k;
  }
  return found;
}

// On an I/O thread, once the headers are in: everything but the routes that need the body.
std::optional<HttpResponse> HttpServer::on_head(const HttpRequest& req) {
  auto counted = [&](HttpResponse r) {
    metrics_.count_http(route_label(req.path), r.status);
    return std::optional<HttpResponse>(std::move(r));
  };
  if (req.path.rfind("/admin/", 0) == 0) return admin_on_head(req);
  if (!config_.api_keys.empty() && req.path != "/health") {
    if (authenticated_key(req) == nullptr) {
      return counted(error_response(ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                                             "", "invalid_api_key")));
    }
  }
  const bool post_route = one_of(req.path, kPostRoutes);
  const bool get_route = one_of(req.path, kGetRoutes) || req.path.rfind("/v1/models/", 0) == 0;
  if (!post_route && !get_route) {
    return counted(error_response(ApiError(404, "no route for " + req.method + " " + req.path, "", "not_found")));
  }
  if (get_route) return counted(req.method == "GET" ? get_route_answer(req) : not_allowed(req, "GET"));
  if (req.method != "POST") return counted(not_allowed(req, "POST"));
  if (!req.has_body) {
    return counted(error_response(ApiError(400, "POST " + req.path + " without a body: send one with Content-Length or "
                                                "Transfer-Encoding: chunked", "", "invalid_request")));
  }
  if (req.header("Content-Type").rfind("multipart/form-data", 0) == 0) {
    return counted(error_response(ApiError(415, "multipart form data is not accepted: send the request as JSON "
                                                "(Content-Type: application/json)", "", "unsupported_media_type")));
  }
  return std::nullopt;  // read the body; `handle` answers
}

// The admin API: its own key (never the clients' keys), checked before anything else.
std::optional<HttpResponse> HttpServer::admin_on_head(const HttpRequest& req) {
  auto counted = [&](HttpResponse r) {
    metrics_.count_http(route_label(req.path), r.status);
    return std::optional<HttpResponse>(std::move(r));
  };
  if (config_.admin_key.empty()) {
    return counted(error_response(ApiError(403, "the admin API is off: set server.admin_key to use it",
                                           "", "admin_disabled")));
  }
  const std::string auth = req.header("Authorization");
  if (auth.rfind("Bearer ", 0) != 0 || !same_secret(auth.substr(7), config_.admin_key)) {
    return counted(error_response(ApiError(401, "the admin API needs 'Authorization: Bearer ADMIN_KEY' (server.admin_key)",
                                           "", "invalid_api_key")));
  }
  if (req.path != "/admin/deployment" && req.path != "/admin/reload") {
    return counted(error_response(ApiError(404, "no route for " + req.method + " " + req.path +
                                                    " (the admin API has /admin/deployment and /admin/reload)",
                                           "", "not_found")));
  }
  if (req.path == "/admin/deployment" && req.method == "GET") return counted(admin(req));
  if (req.method != "POST") return counted(not_allowed(req, req.path == "/admin/reload" ? "POST" : "GET, POST"));
  return std::nullopt;  // read the body (if any); `handle` answers
}

HttpResponse HttpServer::admin(const HttpRequest& req) {
  if (req.path == "/admin/reload") {
    try {
      return json_response(200, {{"status", "reloaded"}, {"deployment", reload()}});
    } catch (const Error& e) {
      return error_response(ApiError(400, std::string("reload refused, the running deployment keeps serving: ") + e.what(),
                                     "", "invalid_deployment"));
    } catch (const std::exception& e) {  // out of memory building the new pipelines, say
      return error_response(ApiError(500, std::string("reload failed, the running deployment keeps serving: ") + e.what(),
                                     "", "reload_failed", "server_error"));
    }
  }
  const std::shared_ptr<Deployment> dep = current();
  if (req.method == "POST") {
    // {"model": NAME, "weights": {VARIANT: WEIGHT, ...}}: manual weights; promotion is {canary: 1, stable: 0}.
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::exception&) {
      return error_response(ApiError(400, "the body is not JSON: send {\"model\": NAME, \"weights\": {VARIANT: WEIGHT}}",
                                     "", "invalid_json"));
    }
    try {
      if (!body.is_object() || !body.contains("model") || !body["model"].is_string()) {
        throw ApiError(400, "'model' must name a model of the deployment", "model", "invalid_value");
      }
      const ServedModel* m = dep->find(body["model"].get<std::string>());
      if (m == nullptr || body["model"].get<std::string>().empty()) {
        throw ApiError(400, "'model' is not served; the deployment serves " + dep->names(), "model", "model_not_found");
      }
      if (!body.contains("weights") || !body["weights"].is_object() || body["weights"].empty()) {
        throw ApiError(400, "'weights' must be an object {VARIANT: WEIGHT, ...}", "weights", "invalid_value");
      }
      if (body.size() != 2) throw ApiError(400, "the body has model and weights, nothing else", "", "unknown_parameter");
      std::vector<std::pair<Variant*, double>> changes;
      double total = 0;
      for (const auto& v : m->variants) {
        double w = v->weight.load();
        if (body["weights"].contains(v->name)) {
          const json& given = body["weights"][v->name];
          if (!given.is_number() || !std::isfinite(given.get<double>()) || given.get<double>() < 0) {
            throw ApiError(400, "weights." + v->name + " must be a number >= 0", "weights." + v->name, "invalid_value");
          }
          w = given.get<double>();
          changes.emplace_back(v.get(), w);
        }
        total += w;
      }
      for (const auto& item : body["weights"].items()) {
        const std::string name = item.key();  // clang 14: no structured binding in a lambda
        const bool known = std::any_of(m->variants.begin(), m->variants.end(), [&](const auto& v) { return v->name == name; });
        if (!known) throw ApiError(400, "model '" + m->name + "' has no variant '" + name + "'", "weights." + name, "invalid_value");
      }
      if (!(total > 0)) throw ApiError(400, "the weights would add up to 0: no variant would get traffic", "weights", "invalid_value");
      for (const auto& [v, w] : changes) {
        std::cerr << "admin: model '" << m->name << "' variant '" << v->name << "' weight " << v->weight.load() << " -> " << w
                  << "\n";
        v->weight = w;
      }
    } catch (const ApiError& e) {
      return error_response(e);
    }
  }
  json models = json::array();
  for (const ServedModel& m : dep->models()) {
    json variants = json::array();
    for (const auto& v : m.variants) {
      variants.push_back({{"name", v->name}, {"weight", v->weight.load()}, {"pipeline", v->pipeline_path},
                          {"rollbacks", dep->rollbacks(*v)}, {"weight_bytes", v->pipeline->model().weight_bytes()},
                          {"shares_weights_with", dep->weight_sharers(*v)},
                          {"perplexity", std::isnan(v->perplexity) ? json(nullptr) : json(v->perplexity)}});
    }
    models.push_back({{"name", m.name}, {"variants", variants}});
  }
  return json_response(200, {{"path", dep->path()}, {"models", models}});
}

HttpResponse HttpServer::get_route_answer(const HttpRequest& req) {
  const std::shared_ptr<Deployment> dep = current();
  Deployment& deployment = *dep;
  if (req.path == "/health") {
    const std::string failure = deployment.failure();
    if (!failure.empty()) return json_response(503, {{"status", "failed"}, {"error", failure}});
    if (draining_) return json_response(503, {{"status", "shutting_down"}});
    json names = json::array();
    for (const ServedModel& m : deployment.models()) names.push_back(m.name);
    return json_response(200, {{"status", "ok"}, {"model", deployment.models().front().name}, {"models", names}});
  }
  if (req.path == "/metrics") {
    std::vector<VariantSnapshot> variants;
    for (const ServedModel& m : deployment.models()) {
      for (const auto& v : m.variants) {
        variants.push_back({m.name, v->name, v->weight.load(), v->engine->snapshot(),
                            v->pipeline->decoder().speculator() != nullptr, deployment.rollbacks(*v),
                            v->pipeline->model().weight_bytes()});
      }
    }
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.render(variants, in_flight_);
    return r;
  }
  if (req.path == "/v1/models") {
    json data = json::array();
    for (const ServedModel& m : deployment.models()) data.push_back(model_json(m));
    return json_response(200, {{"object", "list"}, {"data", data}});
  }
  const std::string id = req.path.substr(std::string("/v1/models/").size());
  const ServedModel* m = id.empty() ? nullptr : deployment.find(id);
  if (m == nullptr) {
    return error_response(ApiError(404, "model '" + id + "' does not exist; this server serves " + deployment.names(),
                                   "model", "model_not_found"));
  }
  return json_response(200, model_json(*m));
}

json HttpServer::model_json(const ServedModel& m) const {
  const Variant& v = *m.variants.front();
  json variants = json::array();
  for (const auto& x : m.variants) variants.push_back({{"name", x->name}, {"weight", x->weight.load()}});
  return {{"id", m.name}, {"object", "model"}, {"created", started_}, {"owned_by", "tessera"},
          {"max_model_len", v.pipeline->max_sequence_tokens()}, {"chat_template", v.chat.describe()},
          {"variants", variants}};
}

// On a worker thread, with the body.
std::optional<HttpResponse> HttpServer::handle(const HttpRequest& req, HttpConnection& conn) {
  if (req.path.rfind("/admin/", 0) == 0) {
    HttpResponse r = admin(req);
    metrics_.count_http(route_label(req.path), r.status);
    return r;
  }
  if (req.path == "/v1/completions") return generate(Endpoint::completions, req, conn);
  if (req.path == "/v1/chat/completions") return generate(Endpoint::chat, req, conn);
  HttpResponse r;
  try {
    r = json_response(200, req.path == "/tokenize" ? tokenize(parse_tokenize_request(req.body))
                                                   : detokenize(parse_detokenize_request(req.body)));
  } catch (const ApiError& e) {
    r = error_response(e);
  }
  metrics_.count_http(route_label(req.path), r.status);
  return r;
}

Variant& HttpServer::variant_for(const Deployment& d, const std::string& model, const std::string& user) {
  const ServedModel* m = d.find(model);
  if (m == nullptr) {
    throw ApiError(400, "'model' is '" + model + "', which this server does not serve; it serves " + d.names(),
                   "model", "model_not_found");
  }
  return d.route(*m, user);
}

json HttpServer::tokenize(const TokenizeRequest& r) const {
  const std::shared_ptr<Deployment> dep = current();
  const Variant& v = variant_for(*dep, r.model, "");
  const Tokenizer& tok = v.pipeline->tokenizer();
  const std::string field = r.chat ? "messages" : "prompt";
  std::vector<int32_t> ids;
  try {
    ids = r.chat ? v.chat.encode(tok, r.messages) : r.add_special_tokens ? prompt_ids(tok, r.text) : tok.encode(r.text, false);
  } catch (const Error& e) {
    throw bad_field(field, "cannot tokenize '" + field + "': " + e.what());
  }
  return {{"count", ids.size()}, {"max_model_len", v.pipeline->max_sequence_tokens()}, {"tokens", ids}};
}

json HttpServer::detokenize(const DetokenizeRequest& r) const {
  const std::shared_ptr<Deployment> dep = current();
  const Variant& v = variant_for(*dep, r.model, "");
  const int64_t vocab = v.pipeline->model().config().vocab;
  for (const int32_t t : r.tokens) {
    if (t >= vocab) {
      throw bad_field("tokens", "'tokens' holds token id " + std::to_string(t) + ", outside the vocabulary (0.." +
                                    std::to_string(vocab - 1) + ")");
    }
  }
  return {{"prompt", v.pipeline->tokenizer().decode(r.tokens)}};
}

GenerationRequest HttpServer::build_request(const OpenAiRequest& r, const Variant& v) const {
  Pipeline& pipeline = *v.pipeline;
  const ChatTemplate& templ = v.chat;
  const Tokenizer& tok = pipeline.tokenizer();
  const ModelConfig& model = pipeline.model().config();
  const bool chat = r.endpoint == Endpoint::chat;
  const std::string prompt_field = chat ? "messages" : "prompt";
  GenerationRequest g;
  try {
    if (chat) {
      g.prompt = templ.encode(tok, r.messages, r.tools);
      g.stop_tokens = templ.stop_tokens(tok);
      for (const auto& s : templ.stop_strings(tok)) g.stop.push_back(s);
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
  const int64_t ctx = pipeline.max_sequence_tokens();
  if (n >= ctx) {
    throw bad_field(prompt_field,
                    "the prompt is " + std::to_string(n) + " tokens; " + pipeline.sequence_limit_text() +
                        " must also hold at least one generated token",
                    "context_length_exceeded");
  }
  if (r.max_tokens) {
    if (n + *r.max_tokens > ctx) {
      throw bad_field(r.max_tokens_field,
                      "'" + r.max_tokens_field + "' is " + std::to_string(*r.max_tokens) + ", but the prompt is " +
                          std::to_string(n) +
                          " tokens and the limit " + std::to_string(ctx) + " (" + pipeline.sequence_limit_text() +
                          "): at most " + std::to_string(ctx - n) +
                          " tokens can be generated",
                      "context_length_exceeded");
    }
    g.max_tokens = *r.max_tokens;
  } else {
    g.max_tokens = std::min(config_.default_max_tokens, ctx - n);
  }

  SamplingParams s = pipeline.decoder().default_params();
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

// Holds one of max_queue places until the request is answered (a stream: until it ends).
class HttpServer::Admission {
 public:
  explicit Admission(HttpServer& s) : server_(s) {}
  ~Admission() {
    if (held_) server_.leave();
  }
  bool enter() { return held_ = server_.try_admit(); }

 private:
  HttpServer& server_;
  bool held_ = false;
};


std::optional<HttpResponse> HttpServer::generate(Endpoint endpoint, const HttpRequest& req, HttpConnection& conn) {
  const std::string route = route_label(req.path);
  // This request's deployment: a reload meanwhile lets it finish where it started.
  const std::shared_ptr<Deployment> dep = current();
  Deployment& deployment = *dep;
  std::string user;
  const Variant* variant = nullptr;  // once chosen: named in the response's X-Tessera-Variant header
  Admission admission(*this);
  HttpResponse res;
  try {
    if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down", "server_error");
    OpenAiRequest r = parse_openai_request(endpoint, req.body);
    if (config_.user_from_key) {
      if (const ApiKey* key = authenticated_key(req)) r.user = r.user.empty() ? key->name : key->name + "/" + r.user;
    }
    user = r.user;
    Variant& v = variant_for(deployment, r.model, r.user);
    variant = &v;
    GenerationRequest g = build_request(r, v);
    std::string constraint_kind;
    g.constraint = compile_request_constraint(v.pipeline->constraint(), r, &constraint_kind);
    // Tool calls are read back from the output unless tool_choice is none.
    const bool tool_calls = endpoint == Endpoint::chat && !r.tools.empty() && r.tool_choice != ToolChoice::none;
    if (!admission.enter()) {
      throw ApiError(429, "the server is at capacity (" + std::to_string(config_.max_queue) +
                              " requests in flight); retry later", "", "queue_full");
    }
    std::shared_ptr<RequestHandle> handle;
    try {
      handle = v.engine->submit(std::move(g));
    } catch (const Error& e) {
      if (draining_ || !v.engine->failure().empty()) throw ApiError(503, e.what(), "", "unavailable", "server_error");
      throw bad_field("", e.what());
    }
    if (!constraint_kind.empty()) metrics_.count_constrained(constraint_kind);
    // Numbered by the server: each variant's engine counts its own requests.
    ResponseMeta meta{endpoint, (endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-") + std::to_string(++next_response_id_),
                      int64_t(std::time(nullptr)), v.model};
    if (r.stream) {
      Stream st;
      st.deployment = dep;
      st.variant = &v;
      st.handle = std::move(handle);
      st.request = std::move(r);
      st.meta = std::move(meta);
      if (tool_calls) {
        st.hold = st.request.tool_choice == ToolChoice::automatic ? OutputStart::undecided : OutputStart::call;
      }
      metrics_.count_http(route, 200);  // the route counts the head it sends now
      stream(st, conn);
      return std::nullopt;
    }

    std::string text;
    std::optional<GenerationResult> result;
    bool gone = false;  // the client closed its connection: nobody to answer
    while (!result) {
      if (!gone && conn.client_gone()) {
        gone = true;
        v.engine->cancel(handle->id());
      }
      handle->wait(std::chrono::milliseconds(50), text, result);
    }
    metrics_.observe(user, v.model, v.name, *result);
    deployment.record(v, *result);
    if (gone) {
      res.status = 499;  // nginx's "client closed request", for the route's count; nobody reads it
      res.close = true;
      metrics_.count_user(user, 499);
      metrics_.count_http(route, 499);
      return res;
    }
    if (result->reason == FinishReason::error) {
      if (!v.engine->failure().empty()) throw ApiError(500, result->error, "", "internal_error");
      if (result->model_fault) throw ApiError(500, result->error, "", "generation_failed", "server_error");
      throw bad_field("", result->error, "generation_failed");
    }
    if (result->reason == FinishReason::cancelled) {
      throw ApiError(503, "the request was cancelled: the server is shutting down", "", "cancelled", "server_error");
    }
    json body = response_json(meta, *result, r, v.pipeline->tokenizer());
    if (tool_calls) {
      if (auto calls = parse_tool_calls(result->text, r.tools, r.parallel_tool_calls, v.chat.wants_short_call_ids())) {
        json& choice = body["choices"][0];
        choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = tool_calls_json(*calls);
        choice["finish_reason"] = "tool_calls";
      }
    }
    res = json_response(200, body);
    metrics_.count_user(user, 200);
  } catch (const ApiError& e) {
    res = error_response(e);
    metrics_.count_user(user, e.status());
  }
  if (variant != nullptr) res.headers.emplace_back("X-Tessera-Variant", variant->name);
  metrics_.count_http(route, res.status);
  return res;
}

// Sends the head at once: a client gone while its request is still queued is noticed as one gone
// while it generates (the head's write makes a closed connection reset).
void HttpServer::stream(Stream& st, HttpConnection& conn) {
  bool ok = conn.start_stream(200, "text/event-stream",
                              {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}, {"X-Tessera-Variant", st.variant->name}});
  auto send = [&](const json& j) { return ok = ok && conn.write(sse_event(j)); };
  if (st.meta.endpoint == Endpoint::chat) send(chunk_json(st.meta, "", "assistant"));
  while (ok) {
    std::string text;
    std::optional<GenerationResult> result;
    st.handle->wait(std::chrono::milliseconds(50), text, result);
    st.pending += text;
    if (!result) {
      if (st.hold == OutputStart::undecided) st.hold = classify_output_start(st.pending);
      const size_t n = st.hold == OutputStart::text ? complete_utf8_prefix(st.pending) : 0;
      if (n > 0) {
        send(chunk_json(st.meta, st.pending.substr(0, n)));
        st.pending.erase(0, n);
      }
      if (ok && conn.client_gone()) ok = false;
      continue;
    }
    metrics_.observe(st.request.user, st.variant->model, st.variant->name, *result);
    st.deployment->record(*st.variant, *result);
    st.observed = true;
    std::optional<std::vector<ToolCall>> calls;
    const bool answered = result->reason != FinishReason::error && result->reason != FinishReason::cancelled;
    if (st.hold != OutputStart::text && answered) {
      calls = parse_tool_calls(st.pending, st.request.tools, st.request.parallel_tool_calls,
                               st.variant->chat.wants_short_call_ids());
    }
    if (calls) {
      // Each call whole in one delta (OpenAI's clients join the pieces of a call by its index).
      const json deltas = tool_calls_json(*calls, /*delta=*/true);
      for (const json& d : deltas) {
        json chunk = chunk_json(st.meta, "");
        chunk["choices"][0]["delta"]["tool_calls"] = json::array({d});
        send(chunk);
      }
    } else if (!st.pending.empty()) {
      send(chunk_json(st.meta, st.pending));
    }
    if (result->reason == FinishReason::error || result->reason == FinishReason::cancelled) {
      const ApiError e = result->reason == FinishReason::cancelled
                             ? ApiError(503, "the request was cancelled: the server is shutting down", "",
                                        "cancelled", "server_error")
                             : ApiError(500, result->error, "", "generation_failed", "server_error");
      send(e.body());
    } else {
      json last = chunk_json(st.meta, "", nullptr, calls ? "tool_calls" : openai_finish_reason(result->reason));
      // Usage rides on the last chunk, or with include_usage in OpenAI's separate usage chunk
      // alone: once, for clients that add up the usage of every chunk.
      if (st.request.include_usage) {
        send(last);
        send(usage_chunk_json(st.meta, *result));
      } else {
        last["usage"] = usage_json(*result);
        send(last);
      }
    }
    st.finished = ok && conn.write("data: [DONE]\n\n") && conn.end_stream();
    break;
  }
  // A client that went away cancels its request, which gives its KV blocks back.
  if (!st.finished) st.variant->engine->cancel(st.handle->id());
  // A stream cut short still counts its tokens and first-token time; the cancelled result comes
  // within a step.
  std::string text;
  std::optional<GenerationResult> result;
  for (int i = 0; i < 100 && !st.observed && !result; ++i) st.handle->wait(std::chrono::milliseconds(50), text, result);
  if (result) {
    metrics_.observe(st.request.user, st.variant->model, st.variant->name, *result);
    st.deployment->record(*st.variant, *result);
  }
  metrics_.count_user(st.request.user, st.finished ? 200 : 499);
}

}  // namespace tessera::serve
