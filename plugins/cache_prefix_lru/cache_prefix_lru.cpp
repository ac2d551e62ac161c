// cache: prefix_lru — the paged pool plus prefix reuse. Full, computed blocks are indexed by a hash
// chain over their token ids and a namespace (see prefix_store.h); a new sequence maps the longest
// cached prefix it may see and computes only the rest. Blocks are reference counted: a mapped block
// is shared read-only, finished sequences leave their full blocks cached, and eviction takes
// unreferenced blocks in LRU order, first from users above their share.
//
// Namespaces (isolation):
//   none         one namespace: every request may map every cached block.
//   user         (default) each user its own: a user only maps blocks its own requests created. All
//                requests without a user are "anonymous", so single-tenant traffic still shares.
//   user+shared  as user, plus a shared namespace written by the users listed in shared_users (e.g.
//                a deployment's warm-up requests for its system prompt) that every user may map.
// A request is not retained (its blocks are never cached and are freed when it ends) when the
// request says retain: false, its user is in private_users, or the cache says retain: false.
//
// The mapped prefix always leaves the last token uncached (at most floor((len - 1) / block_size)
// blocks): the engine recomputes that token for its logits, and it must never write into a block
// another sequence may be reading.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "prefix_store.h"
#include "tessera/error.h"
#include "tessera/paged_kv.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

using prefix::Match;
using prefix::PrefixStore;
using prefix::UserState;

enum class Isolation { none, user, user_shared };

Isolation parse_isolation(const std::string& s) {
  if (s == "none") return Isolation::none;
  if (s == "user") return Isolation::user;
  if (s == "user+shared") return Isolation::user_shared;
  throw Error("cache prefix_lru: isolation must be none, user or user+shared, got '" + s + "'");
}

class PrefixLruCache final : public Cache {
 public:
  explicit PrefixLruCache(const Params& p)
      : params_(PagedKvParams::from(p, "prefix_lru")),
        block_size_(params_.block_size),
        isolation_(parse_isolation(p.get_string("isolation"))),
        max_share_(p.get_float("max_share")),
        min_share_(p.get_float("min_share")),
        retain_(p.get_bool("retain")) {
    if (!(max_share_ >= 0.0 && max_share_ <= 1.0)) {
      throw Error("cache prefix_lru: max_share must be in [0, 1] (a share of the pool's blocks), got " +
                  std::to_string(max_share_));
    }
    if (!(min_share_ >= 0.0 && min_share_ <= max_share_)) {
      throw Error("cache prefix_lru: min_share must be in [0, max_share] (max_share is " + std::to_string(max_share_) +
                  "), got " + std::to_string(min_share_));
    }
    for (const std::string& u : p.get_string_list("shared_users")) shared_users_.insert(u);
    for (const std::string& u : p.get_string_list("private_users")) {
      if (shared_users_.count(u) != 0) {
        throw Error("cache prefix_lru: user '" + u + "' is in both shared_users and private_users; a private user's "
                    "blocks are never cached, so it cannot write the shared namespace");
      }
      private_users_.insert(u);
    }
  }

  void configure(Backend& backend, const CacheGeometry& g) override {
    geometry_ = g;
    storage_.allocate(backend, g, params_, "prefix_lru");
    const int64_t n = storage_.num_blocks();
    store_ = std::make_unique<PrefixStore>(n, block_size_, int64_t(min_share_ * double(n)),
                                           int64_t(max_share_ * double(n)));
    seqs_.clear();
  }

  std::optional<CachePlan> plan(std::span<const CacheRequest> requests) override {
    if (!store_) throw Error("cache prefix_lru: plan() before configure()");
    auto decisions = decide(requests);
    if (!decisions) return std::nullopt;
    return make_plan(requests, *decisions);
  }

  void commit(const CachePlan& plan) override {
    if (!store_) throw Error("cache prefix_lru: commit() before configure()");
    // Decide again against the current state: a plan that no longer fits, or whose hits changed,
    // changes nothing.
    auto decisions = decide(plan.requests);
    if (!decisions) {
      throw Error("cache prefix_lru: commit of a plan that no longer fits (" + std::to_string(store_->num_free()) +
                  " blocks free)");
    }
    const CachePlan now = make_plan(plan.requests, *decisions);
    for (size_t i = 0; i < now.grants.size(); ++i) {
      if (i >= plan.grants.size() || now.grants[i].new_blocks != plan.grants[i].new_blocks ||
          now.grants[i].cached_tokens != plan.grants[i].cached_tokens) {
        throw Error("cache prefix_lru: commit of a stale plan (the cache changed since it was made)");
      }
    }
    // Map the hits first, so that allocation cannot evict a block a new sequence is about to map.
    for (Decision& d : *decisions) {
      if (!d.is_new) continue;
      for (int32_t b : d.match.blocks) store_->acquire(b);
    }
    for (Decision& d : *decisions) {
      const CacheRequest& r = *d.request;
      if (d.is_new) {
        UserState& user = store_->open_user(r.user);
        Sequence s;
        s.user = &user;
        s.insert_ns = store_->acquire_namespace(insert_namespace(r.user));
        s.retain = retain_ && r.retain && private_users_.count(r.user) == 0;
        s.table = d.match.blocks;
        s.hashes = d.match.hashes;
        if (!r.tokens.empty()) {
          const int64_t hit = int64_t(d.match.blocks.size()) * block_size_;
          for (PrefixStats* st : {&user.stats, &totals_}) {
            ++st->lookups;
            st->lookup_tokens += int64_t(r.tokens.size());
            st->hit_tokens += hit;
          }
        }
        seqs_.emplace(d.seq, std::move(s));
      }
      Sequence& s = seqs_.at(d.seq);
      if (!r.tokens.empty()) s.tokens.assign(r.tokens.begin(), r.tokens.end());
      const auto blocks = store_->allocate(d.fresh_blocks);
      s.table.insert(s.table.end(), blocks.begin(), blocks.end());
    }
  }

  void mark_computed(SeqId seq, int64_t tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Sequence& s = it->second;
    // Never more than the slots held, so fragmentation stays within [0, 1].
    s.computed = std::clamp<int64_t>(tokens, 0, int64_t(s.table.size()) * block_size_);
    if (!s.retain || s.stopped) return;
    // Full blocks whose KV is computed and whose token ids are known become cacheable.
    const int64_t full = std::min<int64_t>(s.computed, int64_t(s.tokens.size())) / block_size_;
    while (int64_t(s.hashes.size()) < full) {
      const size_t i = s.hashes.size();
      const uint64_t parent = i == 0 ? PrefixStore::kRootHash : s.hashes[i - 1];
      const std::span<const int32_t> block_tokens(s.tokens.data() + i * size_t(block_size_), size_t(block_size_));
      const int32_t b = s.table[i];
      if (!store_->is_cached(b) &&
          store_->insert(b, parent, block_tokens, s.insert_ns, *s.user) == PrefixStore::Insert::over_quota) {
        // Later blocks could never be reached through this one: stop caching the sequence.
        s.stopped = true;
        return;
      }
      s.hashes.push_back(PrefixStore::chain_hash(parent, block_tokens));
    }
  }

  void truncate(SeqId seq, int64_t tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Sequence& s = it->second;
    tokens = std::max<int64_t>(tokens, 0);
    s.computed = std::min(s.computed, tokens);
    const auto keep = size_t(blocks_for(tokens));
    while (s.table.size() > keep) {
      store_->release(s.table.back());  // a cached block stays cached: its KV still matches its tokens
      s.table.pop_back();
    }
    s.hashes.resize(std::min(s.hashes.size(), size_t(tokens / block_size_)));
    if (s.tokens.size() > size_t(tokens)) s.tokens.resize(size_t(tokens));
    // The last kept block will be written past `tokens`: it must not stay a cached (shared) block.
    if (tokens % block_size_ != 0 && s.table.size() == keep && keep > 0) {
      int32_t& b = s.table.back();
      if (!store_->is_cached(b)) return;
      if (store_->ref_count(b) == 1) {
        store_->uncache(b);
        return;
      }
      // Other sequences read it: copy it to a block of our own.
      if (store_->num_free() == 0) {
        throw Error("cache prefix_lru: truncate of sequence " + std::to_string(seq) +
                    " needs one free block to copy a shared block into, and the pool is full");
      }
      const int32_t copy = store_->allocate(1).at(0);
      storage_.copy_block(copy, b);
      store_->release(b);
      b = copy;
    }
  }

  void release(SeqId seq) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    // Last block first: a sequence's tail becomes least recently used, so eviction trims chains from
    // the end and their heads (the shared prefixes) survive longest.
    for (auto b = it->second.table.rbegin(); b != it->second.table.rend(); ++b) store_->release(*b);
    store_->release_namespace(it->second.insert_ns);
    store_->close_user(*it->second.user);
    seqs_.erase(it);
  }

  KvLayerView layer(int64_t index) const override { return storage_.layer(index); }

  std::span<const int32_t> block_table(SeqId seq) const override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return {};
    return it->second.table;
  }

  CacheStats stats() const override {
    CacheStats s;
    s.block_size = block_size_;
    if (!store_) return s;
    s.blocks_total = store_->num_blocks();
    s.blocks_used = store_->num_used();
    s.sequences = int64_t(seqs_.size());
    s.bytes_total = storage_.block_bytes() * size_t(s.blocks_total);
    s.bytes_used = storage_.block_bytes() * size_t(s.blocks_used);
    s.slots_allocated = s.blocks_used * block_size_;
    // A shared block holds its tokens once, however many sequences map it.
    std::unordered_map<int32_t, int64_t> filled;
    for (const auto& [id, seq] : seqs_) {
      for (size_t i = 0; i < seq.table.size(); ++i) {
        const int64_t n = std::clamp<int64_t>(seq.computed - int64_t(i) * block_size_, 0, block_size_);
        int64_t& f = filled[seq.table[i]];
        f = std::max(f, n);
      }
    }
    for (const auto& [block, n] : filled) s.tokens_stored += n;
    s.prefix = totals_;
    s.prefix.cached_blocks = store_->cached_blocks();
    s.prefix.evictions = store_->evictions();
    s.users = store_->user_stats(kReportedUsers, "_other");
    return s;
  }

 private:
  struct Sequence {
    std::vector<int32_t> table;
    int64_t computed = 0;
    std::vector<int32_t> tokens;   // the token ids the engine has shown so far
    std::vector<uint64_t> hashes;  // chain hash of each leading block already cached or offered to the cache
    UserState* user = nullptr;
    uint32_t insert_ns = 0;
    bool retain = true;
    bool stopped = false;  // the user's quota refused a block
  };

  // What a plan does for one sequence (its first and largest request).
  struct Decision {
    SeqId seq = 0;
    const CacheRequest* request = nullptr;
    int64_t total = 0;
    bool is_new = false;
    Match match;               // new sequences: the cached prefix they map
    int64_t fresh_blocks = 0;  // blocks for new KV
    int64_t revived = 0;       // matched blocks nobody held, which leave the free pool
  };

  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  std::string insert_namespace(const std::string& user) const {
    switch (isolation_) {
      case Isolation::none: return "*";
      case Isolation::user: return "u:" + user;
      case Isolation::user_shared: return shared_users_.count(user) != 0 ? "shared" : "u:" + user;
    }
    return "*";
  }

  std::vector<uint32_t> lookup_namespaces(const std::string& user) const {
    std::vector<std::string> keys{insert_namespace(user)};
    if (isolation_ == Isolation::user_shared && keys[0] != "shared") keys.push_back("shared");
    std::vector<uint32_t> out;
    for (const std::string& k : keys) {
      if (auto id = store_->find_namespace(k)) out.push_back(*id);
    }
    return out;
  }

  // The plan's effect against the current state, or nullopt when it does not fit. Changes nothing.
  std::optional<std::vector<Decision>> decide(std::span<const CacheRequest> requests) const {
    std::map<SeqId, Decision> by_seq;  // largest total per sequence: one listed twice counts once
    for (const CacheRequest& r : requests) {
      if (r.total_tokens < 0 || r.total_tokens > geometry_.max_context) return std::nullopt;
      Decision& d = by_seq[r.seq];
      if (d.request == nullptr || r.total_tokens > d.total) {
        d.seq = r.seq;
        d.request = &r;
        d.total = r.total_tokens;
      }
    }
    int64_t new_seqs = 0, needed = 0;
    std::set<int32_t> revived;
    for (auto& [seq, d] : by_seq) {
      auto it = seqs_.find(seq);
      d.is_new = it == seqs_.end();
      int64_t held = d.is_new ? 0 : int64_t(it->second.table.size());
      if (d.is_new) {
        ++new_seqs;
        const auto& tokens = d.request->tokens;
        const int64_t max_hit = tokens.empty() ? 0 : (int64_t(tokens.size()) - 1) / block_size_;
        const auto namespaces = lookup_namespaces(d.request->user);
        d.match = store_->match(tokens, max_hit, namespaces);
        for (int32_t b : d.match.blocks) {
          if (store_->ref_count(b) == 0 && revived.insert(b).second) ++d.revived;
        }
        held = int64_t(d.match.blocks.size());
      }
      d.fresh_blocks = std::max<int64_t>(0, blocks_for(d.total) - held);
      needed += d.fresh_blocks + d.revived;
    }
    if (needed > store_->num_free()) return std::nullopt;
    if (params_.max_seqs > 0 && int64_t(seqs_.size()) + new_seqs > params_.max_seqs) return std::nullopt;
    std::vector<Decision> out;
    for (auto& [seq, d] : by_seq) out.push_back(std::move(d));
    return out;
  }

  CachePlan make_plan(std::span<const CacheRequest> requests, const std::vector<Decision>& decisions) const {
    CachePlan plan;
    plan.requests.assign(requests.begin(), requests.end());
    std::set<SeqId> granted;
    for (const CacheRequest& r : requests) {
      // A sequence's blocks and hit are granted at its first mention; later mentions take nothing.
      CacheGrant g{r.seq, 0, 0};
      if (granted.insert(r.seq).second) {
        const Decision& d = *std::find_if(decisions.begin(), decisions.end(),
                                          [&](const Decision& x) { return x.seq == r.seq; });
        g.new_blocks = d.fresh_blocks + d.revived;
        g.cached_tokens = int64_t(d.match.blocks.size()) * block_size_;
      }
      plan.grants.push_back(g);
    }
    return plan;
  }

  PagedKvParams params_;
  int64_t block_size_;
  Isolation isolation_;
  double max_share_, min_share_;
  bool retain_;
  std::set<std::string> shared_users_, private_users_;
  CacheGeometry geometry_;
  PagedKvStorage storage_;
  std::unique_ptr<PrefixStore> store_;
  std::unordered_map<SeqId, Sequence> seqs_;
  PrefixStats totals_;  // lookups, lookup_tokens, hit_tokens (the rest comes from the store)
  // Users named in stats() (and so in /metrics); the others are summed as "_other", as the server's
  // own per-user series are past their cap.
  static constexpr size_t kReportedUsers = 100;
};

void register_prefix_lru(Registrar& r) {
  std::vector<ParamSpec> specs = PagedKvParams::specs();
  specs.push_back({"isolation", ParamType::string, "user",
                   "who may map whose cached blocks: none (everyone), user (only the user's own; the default), "
                   "user+shared (own plus the shared namespace written by shared_users)",
                   {"none", "user", "user+shared"}});
  specs.push_back({"max_share", ParamType::number, 1.0,
                   "most of the pool's blocks one user may hold cached, as a share in [0, 1]", {}});
  specs.push_back({"min_share", ParamType::number, 0.0,
                   "share of the pool each user keeps cached, running or idle, before others' blocks are "
                   "evicted, in [0, max_share]", {}});
  specs.push_back({"retain", ParamType::boolean, true,
                   "cache finished blocks for reuse; false: no request's blocks are retained", {}});
  specs.push_back({"shared_users", ParamType::string_list, nlohmann::json::array(),
                   "users whose blocks go to the shared namespace that every user maps under isolation "
                   "user+shared (e.g. [system] for a deployment's system-prompt warm-up)", {}});
  specs.push_back({"private_users", ParamType::string_list, nlohmann::json::array(),
                   "users whose blocks are never cached (freed when their requests end)", {}});
  r.add<Cache>("prefix_lru",
               "paged KV with prefix reuse: cached full blocks shared by hash chain, LRU eviction, per-user "
               "isolation, quotas and no-retain",
               std::move(specs), [](const Params& p) { return std::make_unique<PrefixLruCache>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("cache_prefix_lru", tessera::register_prefix_lru)
