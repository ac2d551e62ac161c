// Proposers that draft with a model, k autoregressive steps batched over the sequences:
//  - layer_skip: the target's first N layers and its output head, on the target's own KV cache. The
//    target has KV for everything but the last token, and the first N layers of that KV are exactly
//    what the shallow model needs; the verification forward rewrites the draft positions afterwards.
//  - draft_model / self_quantized: a second Model (another GGUF with the same vocabulary, or the
//    target's GGUF through another quantizer) with its own attention and paged KV cache. It catches up
//    on tokens it has not seen (the prompt, the verifier's token) and keeps KV for accepted drafts.
#include <filesystem>

#include "proposer.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/model.h"
#include "tessera/pipeline_spec.h"
#include "tessera/registry.h"
#include "tessera/tokenizer.h"

namespace tessera::speculative {
namespace {

// Draws drafts from a model's logits with the request's sampling settings, so that the drafts follow
// what the target will most likely pick (penalties included).
class DraftChooser {
 public:
  int32_t choose(const DraftRequest& r, std::span<const int32_t> history, const float* logits, int64_t vocab,
                 Proposal& out) {
    const float* l = sampler_.penalized(r.params, logits, vocab, history, r.prompt_tokens);
    if (r.params.temperature == 0.0) return argmax(l, vocab);
    sampling_distribution(r.params, l, vocab, dist_);
    const int32_t t = draw(dist_, *r.rng_state);
    out.q.push_back(dist_);
    return t;
  }

 private:
  TokenSampler sampler_;
  std::vector<Candidate> dist_;
};

class ModelProposer : public Proposer {
 public:
  void propose(std::span<DraftRequest> requests, std::vector<Proposal>& proposals) override {
    proposals.assign(requests.size(), {});
    struct Active {
      size_t index;
      std::vector<int32_t> tokens;  // the sequence followed by its drafts so far
      int64_t start;                // first position to compute in the first step
      int64_t k;
    };
    std::vector<Active> active;
    for (size_t i = 0; i < requests.size(); ++i) {
      DraftRequest& r = requests[i];
      r.draft.clear();
      const auto len = int64_t(r.tokens.size());
      const int64_t k = std::min(r.max_draft, model().config().context_length - len + 1);
      if (k <= 0) continue;
      const int64_t start = prepare(r, k);
      if (start < 0) continue;
      Active a{i, {}, start, k};
      a.tokens.reserve(size_t(len + k));  // spans into it stay valid while drafts are appended
      a.tokens.assign(r.tokens.begin(), r.tokens.end());
      active.push_back(std::move(a));
    }
    const int64_t vocab = model().config().vocab;
    std::vector<ForwardSeq> batch;
    std::vector<Active*> in_batch;
    for (int64_t step = 0; !active.empty(); ++step) {
      batch.clear();
      in_batch.clear();
      for (Active& a : active) {
        if (int64_t(requests[a.index].draft.size()) >= a.k) continue;
        const auto len = int64_t(a.tokens.size());
        const int64_t from = step == 0 ? a.start : len - 1;
        ForwardSeq fs;
        fs.seq = requests[a.index].seq;
        fs.tokens = std::span<const int32_t>(a.tokens).subspan(size_t(from));
        fs.start_pos = from;
        fs.logit_rows = 1;
        batch.push_back(fs);
        in_batch.push_back(&a);
      }
      if (batch.empty()) break;
      model().forward(batch, attention(), cache(), logits_, layers());
      for (size_t b = 0; b < in_batch.size(); ++b) {
        Active& a = *in_batch[b];
        DraftRequest& r = requests[a.index];
        const int32_t t = chooser_.choose(r, a.tokens, logits_.data() + b * size_t(vocab), vocab, proposals[a.index]);
        a.tokens.push_back(t);
        r.draft.push_back(t);
      }
    }
    for (const Active& a : active) {
      const DraftRequest& r = requests[a.index];
      // KV now holds the sequence and every draft but the last.
      computed(r.seq, int64_t(r.tokens.size() + r.draft.size()) - 1);
    }
  }

 protected:
  virtual Model& model() = 0;
  virtual Cache& cache() = 0;
  virtual Attention& attention() = 0;
  virtual int64_t layers() const = 0;
  // Makes room for k drafts; returns the first position to compute, or -1 to skip this sequence.
  virtual int64_t prepare(const DraftRequest& r, int64_t k) = 0;
  virtual void computed(SeqId seq, int64_t tokens) = 0;

 private:
  DraftChooser chooser_;
  std::vector<float> logits_;
};

class LayerSkipProposer final : public ModelProposer {
 public:
  explicit LayerSkipProposer(const Params& p) : layers_(p.get_int("layers")) {
    if (layers_ < 0) throw Error("layers=" + std::to_string(layers_) + " must be >= 0 (0 = half the target's layers)");
  }

  void attach(const SpeculationHost& host) override {
    model_ = &host.model;
    cache_ = &host.cache;
    attention_ = &host.attention;
    const int64_t n = host.model.config().n_layers;
    if (layers_ == 0) layers_ = std::max<int64_t>(1, n / 2);
    if (layers_ >= n) {
      throw Error("layer_skip: layers=" + std::to_string(layers_) + " must be below the target's " +
                  std::to_string(n) + " layers");
    }
  }

 protected:
  Model& model() override { return *model_; }
  Cache& cache() override { return *cache_; }
  Attention& attention() override { return *attention_; }
  int64_t layers() const override { return layers_; }
  // The engine reserved the target cache's look-ahead; all but the last token is computed.
  int64_t prepare(const DraftRequest& r, int64_t) override { return int64_t(r.tokens.size()) - 1; }
  void computed(SeqId, int64_t) override {}

 private:
  int64_t layers_;
  Model* model_ = nullptr;
  Cache* cache_ = nullptr;
  Attention* attention_ = nullptr;
};

// A relative path is tried from the working directory, then from the folder of the pipeline file
// that wrote it (an extended file's, where a pipeline inherits the parameter) and its parent, as a
// pipeline's own model path is.
std::string resolve(const std::string& path, const PipelineSpec& spec) {
  namespace fs = std::filesystem;
  fs::path p = path;
  // From the file that wrote draft_model: an extended pipeline's, when this one only inherits it.
  std::string from = spec.path;
  const auto& where = spec.components.at(ComponentKind::decoder).param_where;
  if (const auto it = where.find("draft_model"); it != where.end()) {
    const std::string file = it->second.substr(0, it->second.rfind(':'));
    if (fs::is_regular_file(file)) from = file;
  }
  if (p.is_relative() && !fs::exists(p) && !from.empty()) {
    const fs::path dir = fs::path(from).parent_path();
    for (const fs::path& cand : {dir / p, dir.parent_path() / p}) {
      if (fs::exists(cand)) return cand.string();
    }
  }
  return path;
}

class DraftModelProposer final : public ModelProposer {
 public:
  DraftModelProposer(const Params& p, std::string kind)
      : kind_(std::move(kind)),
        path_(p.get_string("draft_model")),
        quantizer_name_(p.get_string("draft_quantizer")),
        memory_(p.get_int("draft_memory")) {
    if (kind_ == "draft_model" && path_.empty()) {
      throw Error("proposer draft_model needs draft_model: PATH (a GGUF with the target's vocabulary)");
    }
    if (kind_ == "self_quantized" && quantizer_name_.empty()) quantizer_name_ = "int4";
  }

  void attach(const SpeculationHost& host) override {
    const std::string where = host.spec.components.at(ComponentKind::decoder).where + ": draft";
    if (kind_ == "draft_model") {
      const std::string path = resolve(path_, host.spec);
      if (!std::filesystem::exists(path)) throw Error("draft_model: file '" + path_ + "' not found");
      file_ = GgufFile::open(path);
      check_vocabulary(load_vocabulary(*file_), host.tokenizer.vocabulary(), path, host.spec.model);
    } else {
      file_ = host.file;
    }
    // No draft_quantizer (draft_model only; self_quantized defaults to int4): the target's, with
    // its parameters.
    const ComponentSpec& target = host.spec.components.at(ComponentKind::quantizer);
    const bool own = !quantizer_name_.empty();
    const std::string& name = own ? quantizer_name_ : target.plugin;
    quantizer_ = host.registry.create<Quantizer>(name, own ? nlohmann::json::object() : target.params,
                                                 where + " quantizer " + name);
    model_ = std::make_unique<Model>(file_, host.backend, *quantizer_);
    const ModelConfig& c = model_->config();
    if (c.vocab != host.model.config().vocab) {
      throw Error("the draft model has a vocabulary of " + std::to_string(c.vocab) + " tokens, the target " +
                  std::to_string(host.model.config().vocab));
    }
    const ComponentSpec& a = host.spec.components.at(ComponentKind::attention);
    attention_ = host.registry.create<Attention>(a.plugin, a.params, where + " attention " + a.plugin);
    attention_->configure(attention_shape(c));
    cache_ = host.registry.create<Cache>("paged", nlohmann::json{{"memory", memory_}}, where + " cache paged");
    // The draft's cache in the pipeline's KV type, as the target's (the backend checked it).
    cache_->configure(host.backend,
                      CacheGeometry{c.n_layers, c.n_kv_heads, c.head_dim, c.context_length, host.spec.kv_dtype});
  }

  void rollback(SeqId seq, int64_t tokens) override {
    auto it = computed_.find(seq);
    if (it == computed_.end() || it->second <= tokens) return;
    it->second = tokens;
    cache_->truncate(seq, tokens);
  }

  void release(SeqId seq) override {
    computed_.erase(seq);
    if (cache_) cache_->release(seq);
  }

 protected:
  Model& model() override { return *model_; }
  Cache& cache() override { return *cache_; }
  Attention& attention() override { return *attention_; }
  int64_t layers() const override { return 0; }

  int64_t prepare(const DraftRequest& r, int64_t k) override {
    const auto len = int64_t(r.tokens.size());
    CacheRequest req{r.seq, len + k - 1, r.tokens, "draft", false};
    auto plan = cache_->plan(std::span<const CacheRequest>(&req, 1));
    if (!plan) return -1;  // the draft cache is full: this sequence runs without drafts this step
    cache_->commit(*plan);
    auto it = computed_.find(r.seq);
    return it == computed_.end() ? 0 : std::min(it->second, len - 1);
  }

  void computed(SeqId seq, int64_t tokens) override {
    computed_[seq] = tokens;
    cache_->mark_computed(seq, tokens);
  }

 private:
  static void check_vocabulary(const Vocabulary& draft, const Vocabulary& target, const std::string& draft_path,
                               const std::string& target_path) {
    if (draft.tokens.size() != target.tokens.size()) {
      throw Error("vocabulary mismatch: draft model '" + draft_path + "' has " + std::to_string(draft.tokens.size()) +
                  " tokens, target '" + target_path + "' has " + std::to_string(target.tokens.size()));
    }
    for (size_t i = 0; i < draft.tokens.size(); ++i) {
      if (draft.tokens[i] != target.tokens[i]) {
        throw Error("vocabulary mismatch: token " + std::to_string(i) + " is '" + draft.tokens[i] +
                    "' in draft model '" + draft_path + "' but '" + target.tokens[i] + "' in target '" +
                    target_path + "'");
      }
    }
  }

  std::string kind_, path_, quantizer_name_;
  int64_t memory_;
  // Destruction runs bottom-up: the model and cache go before the plugin objects they came from.
  std::shared_ptr<const GgufFile> file_;
  std::shared_ptr<Quantizer> quantizer_;
  std::shared_ptr<Attention> attention_;
  std::shared_ptr<Cache> cache_;
  std::unique_ptr<Model> model_;
  std::map<SeqId, int64_t> computed_;
};

}  // namespace

std::unique_ptr<Proposer> make_layer_skip_proposer(const Params& p) { return std::make_unique<LayerSkipProposer>(p); }

std::unique_ptr<Proposer> make_model_proposer(const Params& p, const std::string& kind) {
  return std::make_unique<DraftModelProposer>(p, kind);
}

}  // namespace tessera::speculative
