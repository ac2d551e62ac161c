// cache: contiguous — every sequence takes a whole max-length slot when it starts (the baseline that
// paging is measured against). In block terms: one block per sequence, block_size = max_len.
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/device_buffer.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class ContiguousCache final : public Cache {
 public:
  explicit ContiguousCache(const Params& p)
      : max_seqs_(p.get_int("max_seqs")), max_len_(p.get_int("max_len")), memory_(p.get_int("memory")) {
    if (max_seqs_ < 0) throw Error("cache contiguous: max_seqs must be >= 0, got " + std::to_string(max_seqs_));
    if (max_len_ < 0) throw Error("cache contiguous: max_len must be >= 0, got " + std::to_string(max_len_));
  }

  void configure(Backend& backend, const CacheGeometry& g) override {
    geometry_ = g;
    if (max_len_ == 0 || max_len_ > g.max_context) max_len_ = g.max_context;
    const size_t slot_bytes = g.bytes_per_token() * size_t(max_len_);
    if (memory_ > 0) {
      const int64_t fit = memory_ / int64_t(slot_bytes);
      if (fit < 1) {
        throw Error("cache contiguous: memory " + std::to_string(memory_) + " bytes cannot hold one sequence of " +
                    std::to_string(max_len_) + " tokens (" + std::to_string(slot_bytes) + " bytes)");
      }
      max_seqs_ = max_seqs_ == 0 ? fit : std::min(max_seqs_, fit);
    }
    if (max_seqs_ == 0) max_seqs_ = 8;
    const size_t layer_slot_bytes = slot_bytes / size_t(g.n_layers) / 2;
    const auto pool = [&] {
      return "max_seqs " + std::to_string(max_seqs_) + " x max_len " + std::to_string(max_len_) + " tokens x " +
             std::to_string(g.bytes_per_token()) + " bytes per token";
    };
    if (size_t(max_seqs_) > std::numeric_limits<size_t>::max() / 2 / slot_bytes) {
      throw Error("cache contiguous: " + pool() + " is past any memory");
    }
    try {
      for (int64_t l = 0; l < g.n_layers; ++l) {
        k_.emplace_back(backend, layer_slot_bytes * size_t(max_seqs_));
        v_.emplace_back(backend, layer_slot_bytes * size_t(max_seqs_));
      }
    } catch (const Error& e) {
      k_.clear();
      v_.clear();
      throw Error("cache contiguous: " + pool() + " (" + std::to_string(slot_bytes * size_t(max_seqs_)) +
                  " bytes) does not fit: " + e.what());
    }
    free_.clear();
    for (int64_t s = max_seqs_ - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  }

  std::optional<CachePlan> plan(std::span<const CacheRequest> requests) override {
    CachePlan plan;
    int64_t new_slots = 0;
    for (const CacheRequest& r : requests) {
      if (r.total_tokens > max_len_) return std::nullopt;
      const bool has = seqs_.count(r.seq) != 0;
      plan.requests.push_back(r);
      plan.grants.push_back({r.seq, has ? 0 : 1, 0});
      // A sequence listed twice in one plan still takes one slot.
      if (!has && std::none_of(plan.requests.begin(), plan.requests.end() - 1,
                               [&](const CacheRequest& o) { return o.seq == r.seq; })) {
        ++new_slots;
      }
    }
    if (new_slots > static_cast<int64_t>(free_.size())) return std::nullopt;
    return plan;
  }

  void commit(const CachePlan& plan) override {
    for (const CacheRequest& r : plan.requests) {
      auto it = seqs_.find(r.seq);
      if (it == seqs_.end()) {
        if (free_.empty()) throw Error("cache contiguous: commit of a plan that no longer fits");
        it = seqs_.emplace(r.seq, Slot{free_.back(), 0}).first;
        free_.pop_back();
      }
    }
  }

  void mark_computed(SeqId seq, int64_t tokens) override {
    auto it = seqs_.find(seq);
    if (it != seqs_.end()) it->second.tokens = tokens;
  }

  void truncate(SeqId seq, int64_t tokens) override {
    auto it = seqs_.find(seq);
    if (it != seqs_.end()) it->second.tokens = std::min(it->second.tokens, std::max<int64_t>(tokens, 0));
  }

  void release(SeqId seq) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    free_.push_back(it->second.table[0]);
    seqs_.erase(it);
  }

  KvLayerView layer(int64_t index) const override {
    KvLayerView v;
    v.k = k_[size_t(index)].get();
    v.v = v_[size_t(index)].get();
    v.dtype = geometry_.dtype;
    v.num_blocks = max_seqs_;
    v.block_size = max_len_;
    v.n_kv_heads = geometry_.n_kv_heads;
    v.head_dim = geometry_.head_dim;
    return v;
  }

  std::span<const int32_t> block_table(SeqId seq) const override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return {};
    return {it->second.table, 1};
  }

  CacheStats stats() const override {
    CacheStats s;
    s.block_size = max_len_;
    s.blocks_total = max_seqs_;
    s.blocks_used = static_cast<int64_t>(seqs_.size());
    s.sequences = s.blocks_used;
    s.bytes_total = geometry_.bytes_per_token() * size_t(max_len_ * max_seqs_);
    s.bytes_used = geometry_.bytes_per_token() * size_t(max_len_ * s.blocks_used);
    s.slots_allocated = max_len_ * s.blocks_used;
    s.max_seq_tokens = max_len_;
    for (const auto& [id, slot] : seqs_) s.tokens_stored += slot.tokens;
    return s;
  }

 private:
  struct Slot {
    int32_t table[1];
    int64_t tokens;
  };
  int64_t max_seqs_;
  int64_t max_len_;
  int64_t memory_;
  CacheGeometry geometry_;
  std::vector<DeviceBuffer> k_, v_;
  std::vector<int32_t> free_;
  std::map<SeqId, Slot> seqs_;
};

void register_contiguous(Registrar& r) {
  r.add<Cache>("contiguous", "Each sequence preallocates its maximum length (baseline for paging)",
               {{"max_seqs", ParamType::integer, 8, "sequences that can hold a slot at once; 0 = as many as memory holds (8 without memory)", {}},
                {"max_len", ParamType::integer, 0, "tokens per slot, which bound a sequence as the context does; 0 (or more than the model's context) = the model's context length", {}},
                {"memory", ParamType::size, 0, "cap on KV bytes; 0 = max_seqs x max_len", {}}},
               [](const Params& p) { return std::make_unique<ContiguousCache>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("cache_contiguous", tessera::register_contiguous)
