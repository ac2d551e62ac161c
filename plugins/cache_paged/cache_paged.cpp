// cache: paged — KV memory as a pool of fixed-size blocks (BlockPool), taken on demand as a
// sequence grows and given back when it finishes, so memory follows the tokens actually held rather
// than max_context per sequence. Each sequence has a block table; growth only appends to it.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/device_buffer.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class PagedCache final : public Cache {
 public:
  explicit PagedCache(const Params& p)
      : block_size_(p.get_int("block_size")),
        memory_(p.get_int("memory")),
        memory_share_(p.get_float("memory_share")),
        max_seqs_(p.get_int("max_seqs")) {
    if (block_size_ < 1 || block_size_ > 1024) {
      throw Error("cache paged: block_size must be in 1..1024 (usually 8, 16 or 32), got " +
                  std::to_string(block_size_));
    }
    if (!(memory_share_ >= 0.0 && memory_share_ <= 1.0)) {
      throw Error("cache paged: memory_share must be in [0, 1] (a share of the device's memory), got " +
                  std::to_string(memory_share_));
    }
    if (memory_ == 0 && memory_share_ == 0.0) {
      throw Error("cache paged: memory is 0 and memory_share is 0; give one of them (e.g. memory: 512MiB)");
    }
    if (max_seqs_ < 0) throw Error("cache paged: max_seqs must be >= 0 (0 = no limit), got " + std::to_string(max_seqs_));
  }

  void configure(Backend& backend, const CacheGeometry& g) override {
    geometry_ = g;
    int64_t memory = memory_;
    std::string source = "memory " + std::to_string(memory_) + " bytes";
    if (memory_share_ > 0.0) {
      const auto devices = backend.devices();
      const size_t device_bytes = devices.empty() ? 0 : devices[0].memory_bytes;
      if (device_bytes == 0) {
        throw Error("cache paged: memory_share needs the device's memory size, which backend '" +
                    std::string(backend.name()) + "' does not report; give memory instead");
      }
      memory = static_cast<int64_t>(std::floor(memory_share_ * double(device_bytes)));
      source = "memory_share " + std::to_string(memory_share_) + " of " + std::to_string(device_bytes) +
               " bytes (" + std::to_string(memory) + " bytes)";
    }
    // One layer's K (or V) for one block: [block_size][n_kv_heads][head_dim].
    const size_t layer_block_bytes = dtype_row_bytes(g.dtype, g.n_kv_heads * g.head_dim) * size_t(block_size_);
    const size_t block_bytes = 2 * size_t(g.n_layers) * layer_block_bytes;
    const int64_t num_blocks = block_bytes == 0 ? 0 : memory / int64_t(block_bytes);
    // Paging exists so that the pool may be smaller than max_context x sequences: one block is the
    // minimum; a sequence that outgrows the whole pool is refused by plan() and reported by the engine.
    if (num_blocks < 1) {
      throw Error("cache paged: " + source + " cannot hold one block of block_size " + std::to_string(block_size_) +
                  " tokens at " + std::to_string(g.bytes_per_token()) + " bytes per token (" +
                  std::to_string(block_bytes) + " bytes)");
    }
    pool_ = std::make_unique<BlockPool>(num_blocks);
    block_bytes_ = block_bytes;
    const size_t layer_bytes = layer_block_bytes * size_t(num_blocks);
    k_.clear();
    v_.clear();
    for (int64_t l = 0; l < g.n_layers; ++l) {
      k_.emplace_back(backend, layer_bytes);
      v_.emplace_back(backend, layer_bytes);
    }
    seqs_.clear();
  }

  std::optional<CachePlan> plan(std::span<const CacheRequest> requests) override {
    if (!pool_) throw Error("cache paged: plan() before configure()");
    std::map<SeqId, int64_t> target;  // largest total per sequence: one listed twice counts once
    for (const CacheRequest& r : requests) {
      if (r.total_tokens < 0 || r.total_tokens > geometry_.max_context) return std::nullopt;
      int64_t& t = target[r.seq];
      t = std::max(t, r.total_tokens);
    }
    int64_t new_seqs = 0, new_blocks = 0;
    std::map<SeqId, int64_t> need;
    for (const auto& [seq, total] : target) {
      const Sequence* s = find(seq);
      if (s == nullptr) ++new_seqs;
      need[seq] = std::max<int64_t>(0, blocks_for(total) - (s ? int64_t(s->table.size()) : 0));
      new_blocks += need[seq];
    }
    if (new_blocks > pool_->num_free()) return std::nullopt;
    if (max_seqs_ > 0 && int64_t(seqs_.size()) + new_seqs > max_seqs_) return std::nullopt;
    CachePlan plan;
    plan.requests.assign(requests.begin(), requests.end());
    for (const CacheRequest& r : requests) {
      // A sequence's blocks are granted at its first mention; later mentions take nothing more.
      auto it = need.find(r.seq);
      plan.grants.push_back({r.seq, it->second, 0});
      it->second = 0;
    }
    return plan;
  }

  void commit(const CachePlan& plan) override {
    if (!pool_) throw Error("cache paged: commit() before configure()");
    // Check the whole plan against the current state first, so a stale plan changes nothing.
    std::map<SeqId, int64_t> target;
    for (const CacheRequest& r : plan.requests) {
      int64_t& t = target[r.seq];
      t = std::max(t, r.total_tokens);
    }
    int64_t new_seqs = 0, new_blocks = 0;
    for (const auto& [seq, total] : target) {
      const Sequence* s = find(seq);
      if (s == nullptr) ++new_seqs;
      new_blocks += std::max<int64_t>(0, blocks_for(total) - (s ? int64_t(s->table.size()) : 0));
    }
    if (new_blocks > pool_->num_free() || (max_seqs_ > 0 && int64_t(seqs_.size()) + new_seqs > max_seqs_)) {
      throw Error("cache paged: commit of a plan that no longer fits (" + std::to_string(new_blocks) +
                  " blocks needed, " + std::to_string(pool_->num_free()) + " free)");
    }
    for (const auto& [seq, total] : target) {
      Sequence& s = seqs_[seq];
      const int64_t more = blocks_for(total) - int64_t(s.table.size());
      if (more <= 0) continue;
      const auto blocks = pool_->allocate(more);
      s.table.insert(s.table.end(), blocks.begin(), blocks.end());
    }
  }

  void mark_computed(SeqId seq, int64_t tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    // Never more than the slots held, so fragmentation stays within [0, 1].
    it->second.computed = std::clamp<int64_t>(tokens, 0, int64_t(it->second.table.size()) * block_size_);
  }

  void truncate(SeqId seq, int64_t tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Sequence& s = it->second;
    tokens = std::max<int64_t>(tokens, 0);
    s.computed = std::min(s.computed, tokens);
    const auto keep = size_t(blocks_for(tokens));
    while (s.table.size() > keep) {
      pool_->release(s.table.back());
      s.table.pop_back();
    }
  }

  void release(SeqId seq) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    for (int32_t b : it->second.table) pool_->release(b);
    seqs_.erase(it);
  }

  KvLayerView layer(int64_t index) const override {
    if (index < 0 || index >= int64_t(k_.size())) {
      throw Error("cache paged: layer " + std::to_string(index) + " is out of range (" + std::to_string(k_.size()) +
                  " layers)");
    }
    KvLayerView v;
    v.k = k_[size_t(index)].get();
    v.v = v_[size_t(index)].get();
    v.dtype = geometry_.dtype;
    v.num_blocks = pool_->num_blocks();
    v.block_size = block_size_;
    v.n_kv_heads = geometry_.n_kv_heads;
    v.head_dim = geometry_.head_dim;
    return v;
  }

  std::span<const int32_t> block_table(SeqId seq) const override {
    const Sequence* s = find(seq);
    if (s == nullptr) return {};
    return s->table;
  }

  CacheStats stats() const override {
    CacheStats s;
    s.block_size = block_size_;
    if (!pool_) return s;
    s.blocks_total = pool_->num_blocks();
    s.blocks_used = pool_->num_used();
    s.sequences = int64_t(seqs_.size());
    s.bytes_total = block_bytes_ * size_t(s.blocks_total);
    s.bytes_used = block_bytes_ * size_t(s.blocks_used);
    s.slots_allocated = s.blocks_used * block_size_;
    for (const auto& [id, seq] : seqs_) s.tokens_stored += seq.computed;
    return s;
  }

 private:
  struct Sequence {
    std::vector<int32_t> table;
    int64_t computed = 0;
  };

  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  const Sequence* find(SeqId seq) const {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? nullptr : &it->second;
  }

  int64_t block_size_;
  int64_t memory_;
  double memory_share_;
  int64_t max_seqs_;
  CacheGeometry geometry_;
  size_t block_bytes_ = 0;  // K and V of one block over all layers
  std::unique_ptr<BlockPool> pool_;
  std::vector<DeviceBuffer> k_, v_;
  std::unordered_map<SeqId, Sequence> seqs_;
};

void register_paged(Registrar& r) {
  r.add<Cache>(
      "paged", "KV blocks allocated on demand as sequences grow, returned when they finish (block tables)",
      {{"block_size", ParamType::integer, 16, "tokens per block, 1..1024 (usually 8, 16 or 32)", {}},
       {"memory", ParamType::size, "256MiB", "KV pool size (e.g. 512MiB); 0 = use memory_share", {}},
       {"memory_share", ParamType::number, 0.0,
        "share (0..1] of the device's memory for the pool (total RAM on cpu); when > 0 it replaces memory", {}},
       {"max_seqs", ParamType::integer, 0, "sequences holding blocks at once; 0 = limited only by blocks", {}}},
      [](const Params& p) { return std::make_unique<PagedCache>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("cache_paged", tessera::register_paged)
