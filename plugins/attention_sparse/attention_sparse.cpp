// attention: sparse — block-sparse prefill, dense decode. For a prefill chunk over a long enough
// context, keys and queries are grouped in blocks; each query block keeps the first sink_blocks,
// the blocks of its local window and the best-scoring share of the rest (by the backend's cheap
// mean-query · mean-key block scores), and attention runs densely over the kept blocks only.
// Decode steps (one query) stay dense: choosing blocks per generated token costs more than it saves.
// So do speculative verification passes (AttentionStep::host_verifies): each of their queries must
// get a decode step's output, or greedy speculation would not give the plain decode's tokens.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tessera/device_buffer.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class SparseAttention final : public Attention {
 public:
  explicit SparseAttention(const Params& p)
      : block_(p.get_int("block_size")),
        sink_blocks_(p.get_int("sink_blocks")),
        local_window_(p.get_int("local_window")),
        keep_ratio_(p.get_float("keep_ratio")),
        top_k_(p.get_int("top_k")),
        min_context_(p.get_int("min_context")),
        window_override_(p.get_int("window")) {
    auto fail = [](const std::string& what) { throw Error("attention sparse: " + what); };
    if (block_ < 1 || block_ > 4096) fail("block_size must be in 1..4096, got " + std::to_string(block_));
    if (sink_blocks_ < 0) fail("sink_blocks must be >= 0, got " + std::to_string(sink_blocks_));
    if (local_window_ < 0) {
      fail("local_window must be >= 0 tokens, got " +
           std::to_string(local_window_));
    }
    if (!(keep_ratio_ >= 0.0 && keep_ratio_ <= 1.0)) fail("keep_ratio must be in [0, 1], got " + std::to_string(keep_ratio_));
    if (top_k_ < 0) fail("top_k must be >= 0 (0 = use keep_ratio), got " + std::to_string(top_k_));
    if (min_context_ < 0) fail("min_context must be >= 0, got " + std::to_string(min_context_));
    if (window_override_ < 0) fail("window must be >= 0, got " + std::to_string(window_override_));
  }

  void configure(const AttentionShape& shape) override {
    if (shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0) {
      throw Error("attention sparse: " + std::to_string(shape.n_heads) + " query heads cannot be grouped over " +
                  std::to_string(shape.n_kv_heads) + " kv heads");
    }
    shape_ = shape;
    if (window_override_ > 0) shape_.window = window_override_;
  }

  std::vector<OpRequirement> requirements(DType kv_dtype) const override {
    return {{Op::kv_write, kv_dtype, "attention sparse"},
            {Op::attention, kv_dtype, "attention sparse"},
            {Op::sparse_attention, kv_dtype, "attention sparse"}};
  }

  void forward(Backend& backend, const AttentionStep& step, const KvLayerView& kv, const float* q,
               const float* k, const float* v, float* out) override {
    backend.kv_write(kv, k, v, step.slots, step.n_tokens);
    AttentionArgs args = dense_attention_args(step, shape_, q, out);
    if (plan_layout(step)) {
      seq_base_dev_.ensure(backend, seq_base_.size() * sizeof(int32_t));
      seq_base_dev_.upload(seq_base_.data(), seq_base_.size() * sizeof(int32_t));
      args.sparse.block = block_;
      args.sparse.seq_base = seq_base_dev_.as<int32_t>();
      const size_t score_bytes = size_t(entries_) * size_t(n_kb_stride_) * sizeof(float);
      scores_dev_.ensure(backend, score_bytes);
      backend.attention_block_scores(args, kv, scores_dev_.as<float>());
      scores_.resize(size_t(entries_) * size_t(n_kb_stride_));
      backend.copy_to_host(scores_.data(), scores_dev_.get(), score_bytes);
      select_blocks(step);
      offsets_dev_.ensure(backend, offsets_.size() * sizeof(int32_t));
      offsets_dev_.upload(offsets_.data(), offsets_.size() * sizeof(int32_t));
      kept_dev_.ensure(backend, std::max<size_t>(1, kept_.size()) * sizeof(int32_t));
      if (!kept_.empty()) kept_dev_.upload(kept_.data(), kept_.size() * sizeof(int32_t));
      args.sparse.offsets = offsets_dev_.as<int32_t>();
      args.sparse.kept = kept_dev_.as<int32_t>();
    }
    backend.attention(args, kv);
  }

 private:
  // Which sequences go sparse this step (prefill chunks over at least min_context tokens, not
  // verification passes), and where their entries start. False when every sequence stays dense.
  bool plan_layout(const AttentionStep& step) {
    seq_base_.assign(step.host_seqs.size(), -1);
    entries_ = 0;
    for (size_t i = 0; i < step.host_seqs.size(); ++i) {
      const AttentionSeqDesc& s = step.host_seqs[i];
      const bool verifies = i < step.host_verifies.size() && step.host_verifies[i] != 0;
      if (verifies || s.q_len < 2 || s.context_len < min_context_) continue;
      seq_base_[i] = static_cast<int32_t>(entries_);
      entries_ += shape_.n_kv_heads * query_blocks(s);
    }
    n_kb_stride_ = (step.max_context_len + block_ - 1) / block_;
    return entries_ > 0;
  }

  int64_t query_blocks(const AttentionSeqDesc& s) const {
    return (s.context_len - 1) / block_ - (s.context_len - s.q_len) / block_ + 1;
  }

  // Kept key blocks per entry: sinks, the local window, then the best-scoring share of the rest.
  void select_blocks(const AttentionStep& step) {
    offsets_.assign(1, 0);
    kept_.clear();
    const int64_t local_blocks = (local_window_ + block_ - 1) / block_;
    std::vector<int32_t> rest;
    std::vector<char> keep;
    for (size_t i = 0; i < step.host_seqs.size(); ++i) {
      if (seq_base_[i] < 0) continue;
      const AttentionSeqDesc& s = step.host_seqs[i];
      const int64_t first_qb = (s.context_len - s.q_len) / block_;
      const int64_t n_qb = query_blocks(s);
      for (int64_t h = 0; h < shape_.n_kv_heads; ++h) {
        for (int64_t qb = 0; qb < n_qb; ++qb) {
          const int64_t own = first_qb + qb;  // candidates: key blocks 0..own
          const float* score = scores_.data() + (seq_base_[i] + h * n_qb + qb) * n_kb_stride_;
          keep.assign(size_t(own + 1), 0);
          rest.clear();
          for (int64_t kb = 0; kb <= own; ++kb) {
            if (kb < sink_blocks_ || kb >= own - local_blocks) {
              keep[size_t(kb)] = 1;
            } else {
              rest.push_back(static_cast<int32_t>(kb));
            }
          }
          const auto n_rest = static_cast<int64_t>(rest.size());
          const int64_t take = std::min(
              n_rest, top_k_ > 0 ? top_k_ : static_cast<int64_t>(std::ceil(keep_ratio_ * double(n_rest))));
          std::partial_sort(rest.begin(), rest.begin() + take, rest.end(),
                            [&](int32_t a, int32_t b) { return score[a] > score[b]; });
          for (int64_t r = 0; r < take; ++r) keep[size_t(rest[size_t(r)])] = 1;
          for (int64_t kb = 0; kb <= own; ++kb) {
            if (keep[size_t(kb)]) kept_.push_back(static_cast<int32_t>(kb));
          }
          offsets_.push_back(static_cast<int32_t>(kept_.size()));
        }
      }
    }
  }

  int64_t block_, sink_blocks_, local_window_;
  double keep_ratio_;
  int64_t top_k_, min_context_, window_override_;
  AttentionShape shape_;
  // Per-step layout, host side and its backend copies (kept between steps to avoid reallocating).
  std::vector<int32_t> seq_base_, offsets_, kept_;
  std::vector<float> scores_;
  int64_t entries_ = 0, n_kb_stride_ = 0;
  DeviceBuffer seq_base_dev_, offsets_dev_, kept_dev_, scores_dev_;
};

void register_sparse(Registrar& r) {
  r.add<Attention>(
      "sparse", "Block-sparse prefill (sink + local + top-scoring key blocks), dense decode",
      {{"block_size", ParamType::integer, 64, "tokens per query/key block", {}},
       {"sink_blocks", ParamType::integer, 1, "leading key blocks every query block keeps", {}},
       {"local_window", ParamType::integer, 256,
        "tokens before each query block that are always kept (rounded up to whole blocks; the query's own block "
        "is always kept)", {}},
       {"keep_ratio", ParamType::number, 0.5, "share of the remaining key blocks kept, by score (0..1)", {}},
       {"top_k", ParamType::integer, 0, "keep this many remaining key blocks instead of keep_ratio; 0 = off", {}},
       {"min_context", ParamType::integer, 1024, "contexts shorter than this are attended densely", {}},
       {"window", ParamType::integer, 0, "sliding window for the dense path; 0 = the model's own or none", {}}},
      [](const Params& p) { return std::make_unique<SparseAttention>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("attention_sparse", tessera::register_sparse)
