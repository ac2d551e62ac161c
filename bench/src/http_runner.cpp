#include "tessera/bench/http_runner.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "tessera/error.h"
#include "tessera/tokenizer.h"

namespace tessera::bench {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Endpoint {
  std::string base;    // scheme://host:port
  std::string prefix;  // path before /v1
  std::string url;     // as given, for messages
};

std::unique_ptr<httplib::Client> client(const Endpoint& e, const ServerTarget& t) {
  auto c = std::make_unique<httplib::Client>(e.base);
  c->set_connection_timeout(5, 0);
  c->set_read_timeout(600, 0);  // a long generation streams; the gaps between chunks are short
  c->set_write_timeout(30, 0);
  if (!t.api_key.empty()) c->set_bearer_token_auth(t.api_key);
  return c;
}

// The error message of an OpenAI-style error body, else the body itself (cut).
std::string error_text(int status, const std::string& body) {
  std::string msg = body.substr(0, 300);
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) msg = e["message"].get<std::string>();
    else if (e.is_string()) msg = e.get<std::string>();
  }
  return "HTTP " + std::to_string(status) + (msg.empty() ? "" : ": " + msg);
}

std::string transport_error(const Endpoint& e, httplib::Error err) {
  const std::string what = err == httplib::Error::Connection ? "connection failed (refused, or no such host)"
                           : err == httplib::Error::Read    ? "the connection broke while reading the answer"
                                                            : "transport error";
  return "cannot reach " + e.url + ": " + what + " (httplib: " + httplib::to_string(err) + ")";
}

// One streamed completion: the body's SSE events parsed as they arrive.
struct StreamState {
  std::string buffer;  // bytes not yet split into events
  std::string raw;     // the whole body, for non-2xx answers (first 4 KiB)
  std::string text;
  std::vector<double> chunk_times;
  double first_token = 0;
  std::string finish_reason;
  std::string error;  // an error event inside the stream
  json usage;
  bool done = false;
};

void on_event(StreamState& s, const std::string& data, double now) {
  if (data == "[DONE]") {
    s.done = true;
    return;
  }
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object()) return;
  if (j.contains("error")) {
    s.error = error_text(200, data).substr(10);  // "HTTP 200: " is not the story here
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) s.usage = j["usage"];
  const auto ch = j.find("choices");
  if (ch == j.end() || !ch->is_array() || ch->empty()) return;
  const json& c = (*ch)[0];
  if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
    if (s.first_token == 0) s.first_token = now;
    s.chunk_times.push_back(now);
    s.text += c["text"].get<std::string>();
  }
  if (c.contains("finish_reason") && c["finish_reason"].is_string()) s.finish_reason = c["finish_reason"];
}

FinishReason reason_of(const std::string& r) {
  if (r == "length") return FinishReason::length;
  if (r == "stop") return FinishReason::stop;
  return FinishReason::none;
}

json request_body(const TraceRequest& r, const std::string& prompt_text, const ServerTarget& t,
                  const std::string& model, bool ignore_eos, int64_t max_tokens) {
  json body = {{"max_tokens", max_tokens},
               {"temperature", 0},
               {"user", user_name(r.user)},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (t.token_prompts) body["prompt"] = r.prompt;
  else body["prompt"] = prompt_text;
  if (!model.empty()) body["model"] = model;
  if (ignore_eos) body["ignore_eos"] = true;
  return body;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The counters of a tessera server's /metrics; null when the page is missing or is not tessera's.
json scrape(const Endpoint& e, const ServerTarget& t) {
  auto c = client(e, t);
  c->set_read_timeout(10, 0);
  const auto res = c->Get((e.prefix + "/metrics").c_str());
  if (!res || res->status != 200 || res->body.find("tessera_kv_blocks_total") == std::string::npos) return nullptr;
  json out = json::object();
  for (const char* name :
       {"tessera_kv_blocks_total", "tessera_kv_blocks_used", "tessera_prefix_cache_hit_tokens_total",
        "tessera_prefix_cache_lookup_tokens_total", "tessera_prefix_cache_evictions_total",
        "tessera_engine_preemptions_total", "tessera_engine_steps_total"}) {
    const double v = prometheus_value(res->body, name);
    out[name] = std::isnan(v) ? json(nullptr) : json(v);
  }
  return out;
}

json metrics_delta(const json& before, const json& after) {
  if (!before.is_object() || !after.is_object()) return nullptr;
  auto num = [](const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; };
  const double hit = num(after, "tessera_prefix_cache_hit_tokens_total") - num(before, "tessera_prefix_cache_hit_tokens_total");
  const double look =
      num(after, "tessera_prefix_cache_lookup_tokens_total") - num(before, "tessera_prefix_cache_lookup_tokens_total");
  return {{"source", "the server's /metrics, before and after the run"},
          {"kv_blocks_total", after["tessera_kv_blocks_total"]},
          {"kv_blocks_used_after", after["tessera_kv_blocks_used"]},
          {"prefix_lookup_tokens", look},
          {"prefix_hit_tokens", hit},
          {"prefix_hit_rate", look > 0 ? json(hit / look) : json(nullptr)},
          {"prefix_evictions",
           num(after, "tessera_prefix_cache_evictions_total") - num(before, "tessera_prefix_cache_evictions_total")},
          {"preemptions", num(after, "tessera_engine_preemptions_total") - num(before, "tessera_engine_preemptions_total")},
          {"steps", num(after, "tessera_engine_steps_total") - num(before, "tessera_engine_steps_total")}};
}

std::string first_model(const Endpoint& e, const ServerTarget& t) {
  auto c = client(e, t);
  const auto res = c->Get((e.prefix + "/v1/models").c_str());
  if (!res) throw Error(transport_error(e, res.error()));
  if (res->status / 100 != 2) throw Error(e.url + "/v1/models: " + error_text(res->status, res->body));
  const json j = json::parse(res->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    throw Error(e.url + "/v1/models: no model listed (give --model NAME)");
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace

std::pair<std::string, std::string> split_server_url(const std::string& url) {
  static const std::regex re(R"(^(https?://[^/\s]+)(/[^\s]*)?$)");
  std::smatch m;
  if (!std::regex_match(url, m, re)) {
    throw Error("--server '" + url + "': expected a URL like http://127.0.0.1:8000");
  }
  std::string prefix = m[2].matched ? m[2].str() : "";
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) prefix.resize(prefix.size() - 3);
  return {m[1].str(), prefix};
}

double prometheus_value(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ') {
      try {
        return std::stod(line.substr(name.size() + 1));
      } catch (const std::exception&) {
        return std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

HttpRunResult run_trace_http(const ServerTarget& target, const Trace& trace, const Workload& workload,
                             const Tokenizer& tok, const Progress& progress) {
  const auto [base, prefix] = split_server_url(target.url);
  const Endpoint ep{base, prefix, target.url};
  HttpRunResult out;
  out.model = target.model.empty() ? first_model(ep, target) : target.model;
  const int64_t total = int64_t(trace.requests.size());
  // Text prompts: the trace's ids decoded with the local tokenizer (the server tokenises them again).
  std::vector<std::string> texts{size_t(total), std::string()};
  if (!target.token_prompts) {
    for (int64_t i = 0; i < total; ++i) texts[size_t(i)] = tok.decode(trace.requests[size_t(i)].prompt);
  }

  // The probe: one token for the first prompt, with ignore_eos. A 400 that names ignore_eos means
  // the server does not have the extension; anything else that is not 2xx ends the run.
  if (total > 0) {
    auto c = client(ep, target);
    out.ignore_eos = workload.ignore_eos;
    for (int attempt = 0; attempt < 2; ++attempt) {
      json body = request_body(trace.requests[0], texts[0], target, out.model, out.ignore_eos, 1);
      body["stream"] = false;
      body.erase("stream_options");
      const auto res = c->Post((ep.prefix + "/v1/completions").c_str(), body.dump(), "application/json");
      if (!res) throw Error(transport_error(ep, res.error()));
      if (res->status / 100 == 2) break;
      if (res->status == 400 && out.ignore_eos && res->body.find("ignore_eos") != std::string::npos) {
        out.ignore_eos = false;
        continue;
      }
      throw Error(ep.url + "/v1/completions: " + error_text(res->status, res->body));
    }
  }
  const json metrics_before = scrape(ep, target);

  RunResult& rr = out.run;
  rr.results.resize(size_t(total));
  rr.scheduled.assign(size_t(total), 0.0);
  std::vector<int64_t> prompt_usage(size_t(total), -1);
  out.variants.assign(size_t(total), std::string());
  std::vector<char> usage_seen(size_t(total), 0);
  std::mutex progress_mutex;
  std::atomic<int64_t> finished{0};
  const Clock::time_point t0 = Clock::now();

  auto one = [&](int64_t i) {
    const TraceRequest& tr = trace.requests[size_t(i)];
    GenerationResult& g = rr.results[size_t(i)];
    g.id = RequestId(i + 1);
    g.prompt = tr.prompt;
    StreamState s;
    auto c = client(ep, target);
    httplib::Request req;
    req.method = "POST";
    req.path = ep.prefix + "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    if (!target.api_key.empty()) req.set_header("Authorization", "Bearer " + target.api_key);
    req.body = request_body(tr, texts[size_t(i)], target, out.model, out.ignore_eos, tr.output_tokens).dump();
    // Events are split as bytes arrive, so that each one is timed on arrival.
    req.content_receiver = [&s, t0](const char* data, size_t n, uint64_t, uint64_t) {
      const double now = seconds_since(t0);
      s.buffer.append(data, n);
      if (s.raw.size() < 4096) s.raw.append(data, std::min(n, 4096 - s.raw.size()));
      size_t end;
      while ((end = s.buffer.find("\n\n")) != std::string::npos) {
        std::istringstream ev(s.buffer.substr(0, end));
        s.buffer.erase(0, end + 2);
        std::string line, data_text;
        while (std::getline(ev, line)) {
          if (!line.empty() && line.back() == '\r') line.pop_back();
          if (line.rfind("data:", 0) == 0) data_text += line.substr(line[5] == ' ' ? 6 : 5);
        }
        if (!data_text.empty()) on_event(s, data_text, now);
      }
      return true;
    };
    g.submitted = seconds_since(t0);
    const auto res = c->send(req);
    g.finished = seconds_since(t0);
    if (res) out.variants[size_t(i)] = res->get_header_value("X-Tessera-Variant");
    if (!res) {
      g.reason = FinishReason::error;
      g.error = transport_error(ep, res.error());
    } else if (res->status / 100 != 2) {
      g.reason = FinishReason::error;
      g.error = error_text(res->status, s.raw);
    } else if (!s.error.empty()) {
      g.reason = FinishReason::error;
      g.error = s.error;
    } else if (!s.done && s.finish_reason.empty()) {
      g.reason = FinishReason::error;
      g.error = "the stream ended without a finish_reason or [DONE]";
    } else {
      g.reason = reason_of(s.finish_reason);
      g.text = std::move(s.text);
      g.first_token = s.first_token;
      g.token_times = std::move(s.chunk_times);
      int64_t n_out;
      if (s.usage.is_object() && s.usage.contains("completion_tokens") && s.usage["completion_tokens"].is_number_integer()) {
        n_out = s.usage["completion_tokens"].get<int64_t>();
        usage_seen[size_t(i)] = 1;
        if (s.usage.contains("prompt_tokens") && s.usage["prompt_tokens"].is_number_integer()) {
          prompt_usage[size_t(i)] = s.usage["prompt_tokens"].get<int64_t>();
        }
        const json d = s.usage.value("prompt_tokens_details", json::object());
        if (d.is_object() && d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()) {
          g.cached_tokens = d["cached_tokens"].get<int64_t>();
        }
      } else {
        n_out = int64_t(tok.encode(g.text, false).size());  // no usage: count by the local tokenizer
      }
      g.tokens.assign(size_t(std::max<int64_t>(0, n_out)), -1);
    }
    const int64_t done = ++finished;
    if (progress) {
      std::lock_guard lock(progress_mutex);
      progress(done, total);
    }
  };

  if (workload.arrival.process == Arrival::Process::poisson) {
    // One thread per request, started at its arrival time: the server, not the bench, queues.
    std::vector<std::thread> threads;
    threads.reserve(size_t(total));
    for (int64_t i = 0; i < total; ++i) {
      rr.scheduled[size_t(i)] = trace.requests[size_t(i)].arrival;
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(trace.requests[size_t(i)].arrival)));
      threads.emplace_back(one, i);
    }
    for (auto& t : threads) t.join();
  } else {
    std::atomic<int64_t> next{0};
    std::vector<std::thread> clients;
    const int64_t n = std::min<int64_t>(total, std::max<int64_t>(1, workload.arrival.concurrency));
    for (int64_t k = 0; k < n; ++k) {
      clients.emplace_back([&] {
        for (int64_t i; (i = next++) < total;) {
          rr.scheduled[size_t(i)] = seconds_since(t0);
          one(i);
        }
      });
    }
    for (auto& t : clients) t.join();
  }

  rr.start = 0;
  for (const auto& g : rr.results) rr.end = std::max(rr.end, g.finished);
  for (int64_t i = 0; i < total; ++i) {
    if (rr.results[size_t(i)].reason == FinishReason::error) continue;
    if (!usage_seen[size_t(i)]) ++out.usage_missing;
    if (prompt_usage[size_t(i)] >= 0 && prompt_usage[size_t(i)] != int64_t(trace.requests[size_t(i)].prompt.size())) {
      ++out.prompt_token_mismatches;
    }
  }
  out.server_metrics = metrics_before.is_null() ? json(nullptr) : metrics_delta(metrics_before, scrape(ep, target));
  return out;
}

}  // namespace tessera::bench
