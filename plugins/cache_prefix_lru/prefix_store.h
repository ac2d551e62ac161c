// PrefixStore: the block bookkeeping of the prefix cache — reference counts (BlockPool), the index of
// cached full blocks, per-user accounting and the eviction policy. It owns no KV memory.
//
// A cached block is addressed by (chain hash, namespace): the chain hash covers the block's token
// ids and, through its parent's hash, every token before it; the namespace says who may map it. A
// lookup verifies the stored token ids and parent hash too, so a 64-bit collision cannot hand out
// the wrong KV, and the namespace is compared exactly, so isolation never rests on a hash.
//
// A block is in one of three states: in use (referenced by sequences; maybe also cached), cached and
// unreferenced ("evictable": its KV is kept for reuse, but the memory counts as free), or free and
// uncached. Allocation takes uncached free blocks first and evicts only when none is left: the least
// recently released evictable block among users above their floor (min_share of the pool), and only
// when no such block is left, one under a floor — running sequences are never refused memory that
// idle cache holds. max_share is enforced at insertion: a user at its cap gives up its own least
// recently used unreferenced block, or the new block is not cached.
//
// Namespaces live while a running sequence or a cached block holds them; a user's state too, and
// past that among the kMaxIdleUsers most recently active idle users. So a client that invents a new
// `user` per request cannot grow memory: both are bounded by the pool's blocks, the running
// sequences and that cap. A forgotten user's counters move to the "others" entry of user_stats (so
// that per-user counts still add up to the totals); it starts again from zero when it comes back.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/cache.h"

namespace tessera::prefix {

struct UserState {
  std::string name;
  std::optional<std::list<UserState*>::iterator> idle;  // its place among the idle users, if idle
  PrefixStats stats;  // cached_blocks is the user's cached blocks now (in use or evictable)
  int64_t live_seqs = 0;
  std::set<std::pair<uint64_t, int32_t>> evictable;  // (release tick, block): its unreferenced cached blocks
};

// The longest cached prefix of a token sequence: blocks and their chain hashes, in order.
struct Match {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;
};

class PrefixStore {
 public:
  static constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ull;  // the "parent" of a sequence's first block
  static constexpr size_t kMaxIdleUsers = 1000;  // users without sequence or cached block still remembered
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> block_tokens);

  // floor_blocks and cap_blocks: min_share and max_share of the pool, in blocks.
  PrefixStore(int64_t num_blocks, int64_t block_size, int64_t floor_blocks, int64_t cap_blocks);

  int64_t num_blocks() const { return pool_.num_blocks(); }
  int64_t num_free() const { return pool_.num_free(); }  // uncached free + evictable
  int64_t num_used() const { return pool_.num_used(); }
  int32_t ref_count(int32_t block) const { return pool_.ref_count(block); }
  bool is_cached(int32_t block) const { return info_.at(size_t(block)).cached; }
  int64_t cached_blocks() const { return int64_t(index_.size()); }
  int64_t evictions() const { return evictions_; }

  // A sequence of `name` starts (its state is created on first use) / ends (the state is forgotten
  // when the user has no running sequence and no cached block left). find_user does not create.
  UserState& open_user(const std::string& name);
  void close_user(UserState& user);
  const UserState* find_user(const std::string& name) const;
  int64_t num_users() const { return int64_t(users_.size()); }
  // Up to `max` users' stats, those holding the most cached blocks; the rest, and the counters of
  // forgotten users, summed under `others` (when there are any): a report stays small whatever the
  // number of users.
  std::map<std::string, PrefixStats> user_stats(size_t max, const std::string& others) const;

  // Namespace ids: a sequence holds the one it inserts into (acquire_namespace .. release_namespace)
  // and every cached block holds its own; an id without holders is recycled. find_namespace answers
  // nullopt for a namespace nobody holds (which therefore holds no block).
  uint32_t acquire_namespace(const std::string& key);
  void release_namespace(uint32_t id);
  std::optional<uint32_t> find_namespace(const std::string& key) const;
  int64_t num_namespaces() const { return int64_t(namespace_ids_.size()); }

  // Up to max_blocks leading full blocks of `tokens` found cached; at each position the first
  // namespace of `namespaces` that holds the block wins. Changes nothing.
  Match match(std::span<const int32_t> tokens, int64_t max_blocks, std::span<const uint32_t> namespaces) const;

  // One more holder of a matched block (reviving it from the evictable set when it had none).
  void acquire(int32_t block);
  // n blocks for new KV, each with one reference; evicts by the policy above when no uncached block
  // is free. Throws tessera::Error when n > num_free().
  std::vector<int32_t> allocate(int64_t n);
  // One holder less; the last one leaves a cached block evictable (most recently used) and an
  // uncached one free.
  void release(int32_t block);

  enum class Insert { inserted, duplicate, over_quota };
  // Caches a full block that holds the KV of `block_tokens` after the prefix hashed as `parent`, in
  // `ns`, owned by `owner`. duplicate: the address is taken (the first block keeps it); over_quota:
  // the owner is at max_share and has no unreferenced block of its own to give up.
  Insert insert(int32_t block, uint64_t parent, std::span<const int32_t> block_tokens, uint32_t ns, UserState& owner);
  // Takes a block out of the index (its holders keep it); used before its content changes.
  void uncache(int32_t block);

 private:
  struct Key {
    uint64_t hash;
    uint32_t ns;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return size_t(k.hash ^ (uint64_t(k.ns) * 0xff51afd7ed558ccdull)); }
  };
  struct BlockInfo {
    bool cached = false;
    uint32_t ns = 0;
    uint64_t hash = 0, parent = 0;
    uint64_t tick = 0;  // when it became evictable
    UserState* owner = nullptr;
  };

  void evict(int32_t block);  // an evictable block leaves the index and becomes uncached free
  void note_if_idle(UserState& user);  // joins the idle users; the least recently active past the cap is forgotten
  void forget_evictable(UserState& owner, uint64_t tick, int32_t block);  // referenced again, or uncached
  int32_t pick_victim() const;

  BlockPool pool_;
  int64_t block_size_;
  int64_t floor_blocks_, cap_blocks_;
  std::vector<BlockInfo> info_;
  std::vector<int32_t> tokens_;        // [num_blocks][block_size]: the token ids of each cached block
  std::vector<int32_t> free_uncached_;  // a stack: the lowest ids come out first on a fresh pool
  std::unordered_map<Key, int32_t, KeyHash> index_;
  std::map<std::string, UserState> users_;  // map: node addresses stay valid (sequences point at them)
  // The users with an evictable block: what pick_victim looks through (not every user ever seen).
  std::set<UserState*> owners_of_evictable_;
  struct NamespaceSlot {
    std::string key;
    int64_t holders = 0;
  };
  std::unordered_map<std::string, uint32_t> namespace_ids_;
  std::vector<NamespaceSlot> namespaces_;  // by id
  std::vector<uint32_t> free_namespace_ids_;
  std::list<UserState*> idle_;  // least recently active first
  PrefixStats forgotten_;        // counters of the users forgotten
  uint64_t clock_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace tessera::prefix
