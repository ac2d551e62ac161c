#include "deployment.h"

#include <chrono>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

#include "tessera/error.h"
#include "tessera/eval.h"
#include "tessera/gguf.h"
#include "tessera/read_file.h"

namespace tessera::serve {

namespace {

std::string chat_template_text(const std::string& model_path) {
  const auto file = GgufFile::open(model_path);
  if (file->find("tokenizer.chat_template") == nullptr) return "";
  return file->get_string("tokenizer.chat_template");
}

// FNV-1a then a finalizer: stable across runs and machines, so a user keeps its variant over restarts too.
uint64_t stable_hash(const std::string& a, const std::string& b) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string* s : {&a, &b}) {
    for (const char c : *s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator: ("ab","c") and ("a","bc") differ
  }
  // FNV leaves the high bits of short texts alike ("a".."j" all land near 0.381): mix them (fmix64).
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

Deployment::Deployment(const DeploymentSpec& spec, const PipelineBuilder& build, const std::string& chat_setting)
    : path_(spec.path) {
  for (const ModelSpec& m : spec.models) {
    ServedModel served;
    served.name = m.name;
    served.guard = std::make_unique<ModelGuard>();
    served.guard->spec = m.rollback;
    served.guard->windows.resize(m.variants.size());
    served.guard->rollbacks.resize(m.variants.size());
    for (const VariantSpec& vs : m.variants) {
      auto v = std::make_unique<Variant>();
      v->model = m.name;
      v->name = vs.name;
      v->weight = vs.weight;
      v->pipeline_path = vs.pipeline.path;
      v->index = served.variants.size();
      v->guard = served.guard.get();
      if (m.rollback.enabled && vs.name == m.rollback.stable) served.guard->stable = v->index;
      try {
        v->pipeline = build(vs.pipeline);
        std::string note;
        v->chat = ChatTemplate::choose(chat_setting, chat_template_text(v->pipeline->model_path()), &note);
        if (!note.empty()) std::cerr << "model '" << m.name << "' variant '" << vs.name << "': " << note << "\n";
      } catch (const Error& e) {
        throw Error(vs.where + ": model '" + m.name + "' variant '" + vs.name + "': " + e.what());
      }
      served.variants.push_back(std::move(v));
    }
    if (m.rollback.max_perplexity_delta > 0) check_perplexity(served);
    for (auto& v : served.variants) v->engine = std::make_unique<ServingEngine>(*v->pipeline);
    models_.push_back(std::move(served));
  }
}

Deployment::~Deployment() { stop(); }

const ServedModel* Deployment::find(const std::string& name) const {
  if (name.empty()) return &models_.front();
  for (const ServedModel& m : models_) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

Variant& Deployment::route(const ServedModel& model, const std::string& user) const {
  if (model.variants.size() == 1) return *model.variants.front();
  // One reading of the weights (the admin API or a rollback may change them meanwhile).
  std::vector<double> weights;
  for (const auto& v : model.variants) weights.push_back(v->weight.load());
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  // Every weight 0 (weights are checked > 0 in total at load, a rollback may still zero the rest):
  // the first variant.
  if (!(total > 0)) return *model.variants.front();
  double point;
  if (user.empty()) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    point = std::uniform_real_distribution<double>(0, 1)(rng);
  } else {
    point = double(stable_hash(model.name, user) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  }
  point *= total;
  size_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0) continue;
    if (point < weights[i]) return *model.variants[i];
    point -= weights[i];
    last = i;
  }
  return *model.variants[last];  // rounding at the top end
}

void Deployment::check_perplexity(ServedModel& m) {
  ModelGuard& g = *m.guard;
  const RollbackSpec& spec = g.spec;
  const std::string text = read_file(spec.eval_text, "eval_text", kTextInputLimits);
  for (auto& v : m.variants) {
    // As `tessera eval` and the bench score: chunks of up to 128 tokens, BOS first, at most 8 of them.
    std::vector<int32_t> tokens = perplexity_tokens(v->pipeline->tokenizer(), text);
    const int64_t ctx = std::min<int64_t>(128, v->pipeline->max_sequence_tokens());
    if (int64_t(tokens.size()) > 8 * ctx) tokens.resize(size_t(8 * ctx));
    try {
      v->perplexity = perplexity(*v->pipeline, tokens, ctx).perplexity;
    } catch (const Error& e) {
      throw Error(spec.where + ": rollback: eval_text " + spec.eval_text + ", model '" + m.name + "' variant '" +
                  v->name + "': " + e.what());
    }
  }
  const Variant& stable = *m.variants[g.stable];
  for (auto& v : m.variants) {
    const double delta = v->perplexity - stable.perplexity;
    std::ostringstream figures;
    figures << "perplexity " << v->perplexity << " on " << spec.eval_text;
    if (v.get() == &stable) {
      figures << " (the stable variant: canaries may be up to " << spec.max_perplexity_delta << " above)";
    } else {
      figures << " against the stable variant's " << stable.perplexity << " (delta " << delta
              << ", max_perplexity_delta " << spec.max_perplexity_delta << ")";
    }
    if (v.get() == &stable || !(delta > spec.max_perplexity_delta)) {
      std::cerr << "model '" << m.name << "' variant '" << v->name << "': " << figures.str() << "\n";
      continue;
    }
    const double was = v->weight.exchange(0);
    ++g.rollbacks[v->index]["perplexity"];
    std::cerr << "rollback: model '" << m.name << "' variant '" << v->name << "' weight " << was << " -> 0: "
              << figures.str() << "\n";
  }
}

std::vector<std::string> Deployment::weight_sharers(const Variant& v) const {
  std::vector<std::string> out;
  for (const ServedModel& m : models_) {
    for (const auto& other : m.variants) {
      if (other.get() != &v && other->pipeline->shares_weights_with(*v.pipeline)) out.push_back(m.name + "/" + other->name);
    }
  }
  return out;
}

void Deployment::record(Variant& v, const GenerationResult& r) {
  if (r.reason == FinishReason::cancelled) return;  // the client went away, or the server is stopping
  Outcome o;
  o.time = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  o.error = r.reason == FinishReason::error;
  if (r.first_token > 0) o.ttft = r.ttft();
  const std::vector<double> gaps = r.inter_token_times();
  if (!gaps.empty()) o.tpot = std::accumulate(gaps.begin(), gaps.end(), 0.0) / double(gaps.size());
  ModelGuard& g = *v.guard;
  std::lock_guard lock(g.mutex);
  g.windows[v.index].add(o);
  if (!g.spec.enabled || v.index == g.stable || v.weight.load() <= 0) return;
  for (OutcomeWindow& w : g.windows) w.prune(o.time, g.spec.window);
  const std::optional<Breach> breach = check_canary(g.spec, g.windows[v.index], g.windows[g.stable]);
  if (!breach) return;
  const double was = v.weight.exchange(0);
  ++g.rollbacks[v.index][breach->reason];
  std::cerr << "rollback: model '" << v.model << "' variant '" << v.name << "' weight " << was << " -> 0: "
            << breach->detail << "\n";
}

std::map<std::string, int64_t> Deployment::rollbacks(const Variant& v) const {
  const ModelGuard& g = *v.guard;
  std::lock_guard lock(g.mutex);
  return g.rollbacks[v.index];
}

std::string Deployment::names() const {
  std::string out;
  for (const ServedModel& m : models_) out += (out.empty() ? "'" : ", '") + m.name + "'";
  return out;
}

std::string Deployment::describe() const {
  std::ostringstream out;
  for (const ServedModel& m : models_) {
    if (&m != &models_.front()) out << "; ";
    out << "model '" << m.name << "'";
    if (m.variants.size() == 1) {
      out << ": " << m.variants.front()->pipeline->describe();
      continue;
    }
    double total = 0;
    for (const auto& v : m.variants) total += v->weight.load();
    out << " (variants";
    for (const auto& v : m.variants) out << " " << v->name << " " << 100 * v->weight.load() / total << "%";
    out << ")";
  }
  return out.str();
}

void Deployment::cancel_all() {
  for (ServedModel& m : models_) {
    for (auto& v : m.variants) v->engine->cancel_all();
  }
}

void Deployment::stop() {
  for (ServedModel& m : models_) {
    for (auto& v : m.variants) {
      if (v->engine) v->engine->stop();
    }
  }
}

std::string Deployment::failure() const {
  for (const ServedModel& m : models_) {
    for (const auto& v : m.variants) {
      const std::string f = v->engine->failure();
      if (!f.empty()) return "model '" + m.name + "' variant '" + v->name + "': " + f;
    }
  }
  return "";
}

}  // namespace tessera::serve
