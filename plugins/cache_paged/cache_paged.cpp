// cache: paged — KV memory as a pool of fixed-size blocks (BlockPool), taken on demand as a
// sequence grows and given back when it finishes, so memory follows the tokens actually held rather
// than max_context per sequence. Each sequence has a block table; growth only appends to it.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/error.h"
#include "tessera/paged_kv.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class PagedCache final : public Cache {
 public:
  explicit PagedCache(const Params& p)
      : params_(PagedKvParams::from(p, "paged")), block_size_(params_.block_size), max_seqs_(params_.max_seqs) {}

  void configure(Backend& backend, const CacheGeometry& g) override {
    geometry_ = g;
    storage_.allocate(backend, g, params_, "paged");
    pool_ = std::make_unique<BlockPool>(storage_.num_blocks());
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

  KvLayerView layer(int64_t index) const override { return storage_.layer(index); }

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
    s.bytes_total = storage_.block_bytes() * size_t(s.blocks_total);
    s.bytes_used = storage_.block_bytes() * size_t(s.blocks_used);
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

  PagedKvParams params_;
  int64_t block_size_;
  int64_t max_seqs_;
  CacheGeometry geometry_;
  PagedKvStorage storage_;
  std::unique_ptr<BlockPool> pool_;
  std::unordered_map<SeqId, Sequence> seqs_;
};

void register_paged(Registrar& r) {
  r.add<Cache>(
      "paged", "KV blocks allocated on demand as sequences grow, returned when they finish (block tables)",
      PagedKvParams::specs(),
      [](const Params& p) { return std::make_unique<PagedCache>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("cache_paged", tessera::register_paged)
