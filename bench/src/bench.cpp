// The bench driver: load the workload, measure the machine, run each pipeline alone on the same
// trace (built, run, destroyed, so that its peak memory is its own), then the accuracy pass, then
// the report files.
#include "tessera/bench/bench.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>

#include "tessera/bench/http_runner.h"
#include "tessera/bench/report.h"
#include "tessera/bench/runner.h"
#include "tessera/bench/trace.h"
#include "tessera/bench/workload.h"
#include "tessera/error.h"
#include "tessera/read_file.h"
#include "tessera/eval.h"
#include "tessera/pipeline.h"

namespace tessera::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::unique_ptr<Pipeline> build(const std::string& file, const BenchOptions& o, const Registry& registry) {
  PipelineOptions po;
  po.model = o.model;
  po.backend = o.backend;
  po.kv_dtype = o.kv_dtype;
  po.threads = o.threads;
  return Pipeline::build(load_pipeline_spec(file), registry, po);
}

// A progress line on stderr: redrawn in place on a terminal, one line per pipeline otherwise.
class ProgressBar {
 public:
  ProgressBar(std::ostream& log, bool enabled, std::string label)
      : log_(log), enabled_(enabled), tty_(isatty(2) != 0), label_(std::move(label)),
        start_(std::chrono::steady_clock::now()) {}

  void update(int64_t done, int64_t total) {
    if (!enabled_ || !tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int filled = total > 0 ? int(kWidth * done / total) : kWidth;
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    log_ << "\r" << label_ << " [" << bar << "] " << done << "/" << total << " requests, " << std::fixed
         << std::setprecision(1) << elapsed() << " s" << std::flush;
  }
  void done(const std::string& summary) {
    if (!enabled_) return;
    if (tty_) log_ << "\r\033[K";
    log_ << label_ << " " << summary << "\n" << std::flush;
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::ostream& log_;
  bool enabled_, tty_;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_;
};

std::string unique_name(const std::string& file, const std::vector<PipelineRun>& runs) {
  std::string name = fs::path(file).stem().string();
  int n = 1;
  std::string candidate = name;
  for (bool clash = true; clash;) {
    clash = false;
    for (const auto& r : runs) clash = clash || r.name == candidate;
    if (clash) candidate = name + "-" + std::to_string(++n);
  }
  return candidate;
}

std::string read_text(const std::string& path) { return read_file(path, "accuracy text", kTextInputLimits); }

// Perplexity, KL divergence, teacher-forced and greedy agreement of every pipeline against the
// reference, through the eval path (compare_with_baseline: both pipelines chunk by chunk). Each
// pipeline is rebuilt here, after the timed runs, so that timings and peak memory were taken with
// one pipeline alive at a time.
void accuracy_pass(std::vector<PipelineRun>& runs, const PipelineRun& ref, const Trace& trace, const Workload& w,
                   const BenchOptions& o, const Registry& registry, std::ostream& log) {
  std::string text_path = o.accuracy_text;
  if (text_path.empty() && w.prompts.from_file) text_path = w.prompts.path;
  std::unique_ptr<Pipeline> base;
  try {
    base = build(ref.file, o, registry);
  } catch (const Error& e) {
    for (auto& r : runs) r.accuracy["error"] = std::string("cannot rebuild the reference: ") + e.what();
    return;
  }
  const Tokenizer& tok = base->tokenizer();
  std::vector<int32_t> text;
  if (!text_path.empty()) {
    text = perplexity_tokens(tok, read_text(text_path));
    const size_t keep = size_t(o.accuracy_ctx * o.accuracy_chunks);
    if (text.size() > keep) text.resize(keep);
  }
  // Greedy agreement on the first trace prompts, cut so that prompt and output fit the context.
  std::vector<std::vector<int32_t>> prompts;
  const int64_t context = base->max_sequence_tokens();  // every run holds at least the trace's context
  const int64_t tokens = std::min<int64_t>(o.accuracy_tokens, context / 2);
  for (const auto& r : trace.requests) {
    if (int64_t(prompts.size()) >= o.accuracy_prompts) break;
    std::vector<int32_t> p = r.prompt;
    p.resize(std::min<size_t>(p.size(), size_t(std::min<int64_t>(64, context - tokens - 1))));
    prompts.push_back(std::move(p));
  }
  // The reference's perplexity comes with the first comparison (else on its own, after the loop).
  std::optional<PerplexityResult> base_ppl;
  const bool ctx_fits = o.accuracy_ctx <= context;
  const bool have_text = ctx_fits && int64_t(text.size()) >= o.accuracy_ctx;
  std::string text_note = text_path.empty() ? "n/a: no text (give --accuracy-text or a workload prompt file)"
                          : !ctx_fits ? "n/a: --accuracy-ctx " + std::to_string(o.accuracy_ctx) +
                                            " is longer than the model's context (" + std::to_string(context) +
                                            " tokens)"
                                      : "n/a: " + text_path + " is shorter than one chunk of " +
                                            std::to_string(o.accuracy_ctx) + " tokens";
  json* ref_accuracy = nullptr;
  for (auto& r : runs) {
    if (!r.ok()) continue;
    json& a = r.accuracy;
    if (!r.server.empty()) {
      a["note"] = "n/a over HTTP: perplexity and greedy agreement need the model in-process (see trace_agreement)";
      continue;
    }
    a["text"] = text_path.empty() ? json(nullptr) : json(text_path);
    a["ctx"] = o.accuracy_ctx;
    a["scored_tokens"] = nullptr;
    a["greedy_prompts"] = prompts.size();
    a["greedy_tokens_per_prompt"] = tokens;
    // Every figure is in the report, null until measured: a pass that fails or does not apply
    // leaves it null (with `error` or `perplexity_note`), never out.
    a["perplexity"] = a["perplexity_delta"] = a["perplexity_delta_percent"] = a["teacher_forced_agreement"] =
        a["kl_divergence"] = a["greedy_agreement"] = nullptr;
    if (!have_text) a["perplexity_note"] = text_note;
    if (&r == &ref) {
      ref_accuracy = &a;
      continue;
    }
    try {
      auto p = build(r.file, o, registry);
      if (p->tokenizer().vocab_size() != tok.vocab_size()) {
        throw Error("its vocabulary (" + std::to_string(p->tokenizer().vocab_size()) + ") differs from " + ref.name +
                    "'s (" + std::to_string(tok.vocab_size()) + "): not comparable");
      }
      if (have_text) {
        const BaselineComparison c = compare_with_baseline(*p, *base, text, o.accuracy_ctx);
        if (!base_ppl) base_ppl = c.baseline;
        const PerplexityResult& pr = c.pipeline;
        a["scored_tokens"] = pr.scored_tokens;
        a["perplexity"] = pr.perplexity;
        a["perplexity_delta"] = pr.perplexity - c.baseline.perplexity;
        a["perplexity_delta_percent"] = 100.0 * (pr.perplexity - c.baseline.perplexity) / c.baseline.perplexity;
        a["teacher_forced_agreement"] = teacher_forced_agreement(pr, c.baseline);
        a["kl_divergence"] = {{"mean", c.kl.mean}, {"p99", c.kl.p99}, {"max", c.kl.max}};
      }
      a["greedy_agreement"] = greedy_agreement(*p, *base, prompts, tokens).share;
    } catch (const std::exception& e) {
      a["error"] = e.what();
      log << "warning: accuracy of " << r.name << ": " << e.what() << "\n";
    }
  }
  if (ref_accuracy == nullptr) return;
  json& a = *ref_accuracy;
  a["greedy_agreement"] = 1.0;
  if (!have_text) return;
  try {
    if (!base_ppl) base_ppl = perplexity(*base, text, o.accuracy_ctx);
    a["scored_tokens"] = base_ppl->scored_tokens;
    a["perplexity"] = base_ppl->perplexity;
    a["perplexity_delta"] = 0.0;
    a["perplexity_delta_percent"] = 0.0;
    a["teacher_forced_agreement"] = 1.0;
    a["kl_divergence"] = {{"mean", 0.0}, {"p99", 0.0}, {"max", 0.0}};
  } catch (const std::exception& e) {
    a["error"] = e.what();
    log << "warning: accuracy of " << ref.name << ": " << e.what() << "\n";
  }
}

// Copies what the report needs from a built pipeline.
void describe(PipelineRun& r, Pipeline& p) {
  r.describe = p.describe();
  r.backend = std::string(p.backend().name());
  const auto devices = p.backend().devices();
  r.device = devices.empty() ? "" : devices.front().name;
  r.model_path = p.model_path();
  r.weight_formats = p.model().weight_formats();
  r.decode_regions = p.model().decodes_in_layer_regions() ? "per layer" : "per op";
  r.model = p.model().config();
  r.weight_bytes = p.model().weight_bytes();
  r.greedy = p.decoder().default_params().temperature == 0;
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

// "host:port" of a server URL, made unique among the columns.
std::string server_name(const std::string& url, const std::vector<PipelineRun>& runs) {
  std::string name = url.substr(url.find("://") + 3);
  while (!name.empty() && name.back() == '/') name.pop_back();
  std::string candidate = name;
  for (int n = 1;;) {
    bool clash = false;
    for (const auto& r : runs) clash = clash || r.name == candidate;
    if (!clash) return candidate;
    candidate = name + "-" + std::to_string(++n);
  }
}

// Every --server column on the same trace. The prompts are the trace's ids as text, decoded with
// the tokenizer the trace was drawn with (rebuilt here: the pipelines were destroyed after their
// runs), or drawn now from the trace pipeline when no pipeline loaded.
void run_servers(std::vector<PipelineRun>& runs, Trace& trace, bool& have_trace, int32_t& trace_vocab,
                 const Workload& workload, const BenchOptions& o, const Registry& registry, std::ostream& log) {
  std::string tok_file = o.trace_pipeline;
  for (const auto& r : runs) {
    if (r.ok() && r.server.empty()) {
      tok_file = r.file;
      break;
    }
  }
  if (tok_file.empty()) {
    throw Error("--server needs a tokenizer to draw the trace and decode its prompts: give -m MODEL or a pipeline");
  }
  std::unique_ptr<Pipeline> tp;
  try {
    tp = build(tok_file, o, registry);
  } catch (const Error& e) {
    throw Error(std::string("cannot load the tokenizer for the server runs (") + tok_file + "): " + e.what());
  }
  if (!have_trace) {
    const ModelConfig& mc = tp->model().config();
    for (const auto& msg :
         check_context(workload, tp->max_sequence_tokens(), "model '" + mc.name + "' (" + tp->model_path() + ")")) {
      log << "warning: clamping: " << msg << "\n";
    }
    trace = make_trace(workload, tp->tokenizer(), tp->max_sequence_tokens());
    trace_vocab = tp->tokenizer().vocab_size();
    have_trace = true;
  }
  const int n = int(o.servers.size());
  for (int i = 0; i < n; ++i) {
    PipelineRun r;
    r.server = r.file = r.model_path = o.servers[size_t(i)];
    r.name = server_name(r.server, runs);
    r.backend = "server";
    r.greedy = true;  // every request is sent with temperature 0
    r.weight_formats = "unknown (server)";
    ProgressBar bar(log, o.progress, "[server " + std::to_string(i + 1) + "/" + std::to_string(n) + " " + r.name + "]");
    try {
      ServerTarget t{r.server, o.api_key, o.server_model, o.server_token_prompts};
      HttpRunResult h = run_trace_http(t, trace, workload, tp->tokenizer(),
                                       [&bar](int64_t done, int64_t total) { bar.update(done, total); });
      r.run = std::move(h.run);
      r.served_model = r.model.name = h.model;
      r.ignore_eos = h.ignore_eos;
      r.prompt_token_mismatches = h.prompt_token_mismatches;
      r.usage_missing = h.usage_missing;
      r.server_metrics = std::move(h.server_metrics);
      r.variants = std::move(h.variants);
      r.describe = "OpenAI-compatible server " + r.server + " (model '" + h.model + "', " +
                   (o.server_token_prompts ? "token-id prompts" : "text prompts") + ")";
    } catch (const std::exception& e) {
      r.error = e.what();
      r.failed_stage = "connect";
    }
    if (r.error.empty()) {
      int64_t out_tokens = 0, errors = 0;
      for (const auto& res : r.run.results) {
        out_tokens += int64_t(res.tokens.size());
        errors += res.reason == FinishReason::error;
      }
      bar.done(std::to_string(trace.requests.size()) + " requests in " + fixed(r.run.seconds(), 2) + " s, " +
               fixed(double(out_tokens) / std::max(r.run.seconds(), 1e-9), 0) + " output tok/s" +
               (errors > 0 ? ", " + std::to_string(errors) + " failed" : ""));
    } else {
      bar.done("FAILED (" + r.failed_stage + "): " + r.error);
    }
    runs.push_back(std::move(r));
  }
}

}  // namespace

BenchOutcome run_bench(const BenchOptions& o, const Registry& registry, std::ostream& log) {
  if (o.pipelines.empty() && o.servers.empty()) {
    throw Error("no pipelines or servers given (--pipelines A.yaml B.yaml ..., --server URL ...)");
  }
  const Workload workload = load_workload(o.workload);
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec || !fs::is_directory(o.out_dir)) throw Error(o.out_dir + ": cannot create the output folder: " + ec.message());
  if (o.threads > 0) omp_set_num_threads(o.threads);

  if (o.progress) log << "measuring the machine (read bandwidth, FMA peak)...\n";
  json conditions = machine_conditions(o.probe_seconds);
  conditions["threads"] = o.threads > 0 ? o.threads : omp_get_max_threads();
  conditions["command"] = o.command;

  std::vector<PipelineRun> runs;
  Trace trace;
  bool have_trace = false;
  int32_t trace_vocab = 0;
  const int n = int(o.pipelines.size());
  for (int i = 0; i < n; ++i) {
    PipelineRun r;
    r.file = o.pipelines[size_t(i)];
    r.name = unique_name(r.file, runs);
    ProgressBar bar(log, o.progress, "[" + std::to_string(i + 1) + "/" + std::to_string(n) + " " + r.name + "]");
    r.peak_rss_per_pipeline = reset_peak_rss();
    std::unique_ptr<Pipeline> p;
    try {
      const auto t0 = std::chrono::steady_clock::now();
      p = build(r.file, o, registry);
      r.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      describe(r, *p);
      if (have_trace && p->max_sequence_tokens() < trace.context) {
        throw Error("it holds " + p->sequence_limit_text() + ", fewer than the trace's context of " +
                    std::to_string(trace.context) + " tokens: not comparable");
      }
      if (have_trace && p->tokenizer().vocab_size() != trace_vocab) {
        throw Error("its vocabulary (" + std::to_string(p->tokenizer().vocab_size()) +
                    " tokens) differs from the one the trace was made with (" + std::to_string(trace_vocab) +
                    "): the trace's token ids would mean other text");
      }
    } catch (const Error& e) {
      r.error = e.what();
      r.failed_stage = "load";
    }
    if (r.error.empty() && !have_trace) {
      // The trace is drawn once, with the first pipeline's tokenizer and context. A workload that
      // cannot fit the model is an error of the whole bench (it throws), not of this pipeline.
      for (const auto& msg :
           check_context(workload, p->max_sequence_tokens(), "model '" + r.model.name + "' (" + r.model_path + ")")) {
        log << "warning: clamping: " << msg << "\n";
      }
      trace = make_trace(workload, p->tokenizer(), p->max_sequence_tokens());
      trace_vocab = p->tokenizer().vocab_size();
      have_trace = true;
    }
    if (r.error.empty()) {
      try {
        r.run = run_trace(*p, trace, workload, [&bar](int64_t done, int64_t total) { bar.update(done, total); });
        r.peak_rss = peak_rss_bytes();
      } catch (const std::exception& e) {
        r.error = e.what();
        r.failed_stage = "run";
      }
    }
    p.reset();
    if (r.error.empty()) {
      int64_t out_tokens = 0;
      for (const auto& res : r.run.results) out_tokens += int64_t(res.tokens.size());
      bar.done(std::to_string(trace.requests.size()) + " requests in " + fixed(r.run.seconds(), 2) + " s, " +
               fixed(double(out_tokens) / std::max(r.run.seconds(), 1e-9), 0) + " output tok/s");
    } else {
      bar.done("FAILED (" + r.failed_stage + "): " + r.error);
    }
    runs.push_back(std::move(r));
  }

  if (!o.servers.empty()) run_servers(runs, trace, have_trace, trace_vocab, workload, o, registry, log);

  const PipelineRun* ref = nullptr;
  for (const auto& r : runs) {
    if (r.ok() && ref == nullptr) ref = &r;
  }
  if (ref != nullptr) {
    conditions["backend"] = ref->server.empty() ? ref->backend : "n/a (server " + ref->server + ")";
    conditions["device"] = ref->server.empty() ? ref->device : "n/a";
    conditions["model"] = {{"path", ref->model_path},
                           {"name", ref->model.name},
                           {"weights", ref->weight_formats},
                           {"context", ref->server.empty() ? ref->model.context_length : trace.context}};
    json lengths = json::array();
    for (const auto& c : workload.classes) {
      lengths.push_back({{"class", c.name}, {"prompt", c.prompt.describe()}, {"output", c.output.describe()}});
    }
    conditions["lengths"] = lengths;
    conditions["load"] = workload.arrival.describe();
    if (o.accuracy && ref->server.empty()) {
      if (o.progress) log << "accuracy against " << ref->name << " (perplexity, greedy agreement)...\n";
      accuracy_pass(runs, *ref, trace, workload, o, registry, log);
    }
  }

  BenchOutcome out;
  out.report = have_trace ? make_report(runs, trace, workload, conditions)
                          : make_report(runs, Trace{}, workload, conditions);
  for (const auto& r : runs) (r.ok() ? out.ran : out.failed)++;
  const fs::path dir = o.out_dir;
  const std::vector<std::pair<std::string, std::string>> files = {
      {"report.json", out.report.dump(2, ' ', false, json::error_handler_t::replace) + "\n"},
      {"report.md", render_markdown(out.report)},
      {"report.html", render_html(out.report)}};
  for (const auto& [name, content] : files) {
    const std::string path = (dir / name).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << content;
    if (!f) throw Error(path + ": cannot write the report");
    out.files.push_back(path);
  }
  return out;
}

}  // namespace tessera::bench
