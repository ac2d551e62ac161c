#include "prefix_store.h"

#include <algorithm>
#include <limits>

#include "tessera/error.h"

namespace tessera::prefix {

uint64_t PrefixStore::chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) {
  // FNV-1a over the parent hash and the token ids, then a splitmix64 finaliser to spread the bits.
  uint64_t h = 0xcbf29ce484222325ull ^ parent;
  for (int32_t t : block_tokens) {
    h ^= uint32_t(t);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

PrefixStore::PrefixStore(int64_t num_blocks, int64_t block_size, int64_t floor_blocks, int64_t cap_blocks)
    : pool_(num_blocks),
      block_size_(block_size),
      floor_blocks_(floor_blocks),
      cap_blocks_(cap_blocks),
      info_(size_t(num_blocks)),
      tokens_(size_t(num_blocks * block_size)) {
  free_uncached_.reserve(size_t(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_uncached_.push_back(int32_t(b));
}

UserState& PrefixStore::open_user(const std::string& name) {
  auto [it, added] = users_.try_emplace(name);
  UserState& u = it->second;
  if (added) u.name = name;
  if (u.idle) {
    idle_.erase(*u.idle);
    u.idle.reset();
  }
  ++u.live_seqs;
  return u;
}

void PrefixStore::close_user(UserState& user) {
  --user.live_seqs;
  note_if_idle(user);
}

namespace {
void add_counters(PrefixStats& to, const PrefixStats& from) {
  to.lookups += from.lookups;
  to.lookup_tokens += from.lookup_tokens;
  to.hit_tokens += from.hit_tokens;
  to.cached_blocks += from.cached_blocks;
  to.evictions += from.evictions;
}
}  // namespace

void PrefixStore::note_if_idle(UserState& user) {
  if (user.live_seqs != 0 || user.stats.cached_blocks != 0 || user.idle) return;
  user.idle = idle_.insert(idle_.end(), &user);
  while (idle_.size() > kMaxIdleUsers) {
    const UserState* oldest = idle_.front();
    idle_.pop_front();
    add_counters(forgotten_, oldest->stats);
    users_.erase(users_.find(oldest->name));
  }
}

std::map<std::string, PrefixStats> PrefixStore::user_stats(size_t max, const std::string& others) const {
  std::vector<const UserState*> order;
  order.reserve(users_.size());
  for (const auto& [name, u] : users_) order.push_back(&u);
  const size_t shown = std::min(max, order.size());
  // Most cached blocks first; names break ties so that the report is deterministic.
  std::partial_sort(order.begin(), order.begin() + ptrdiff_t(shown), order.end(), [](const UserState* a, const UserState* b) {
    return a->stats.cached_blocks != b->stats.cached_blocks ? a->stats.cached_blocks > b->stats.cached_blocks
                                                            : a->name < b->name;
  });
  std::map<std::string, PrefixStats> out;
  for (size_t i = 0; i < shown; ++i) out[order[i]->name] = order[i]->stats;
  if (shown < order.size() || forgotten_.lookups != 0 || forgotten_.evictions != 0) {
    PrefixStats& rest = out[others];
    add_counters(rest, forgotten_);
    for (size_t i = shown; i < order.size(); ++i) add_counters(rest, order[i]->stats);
  }
  return out;
}

const UserState* PrefixStore::find_user(const std::string& name) const {
  auto it = users_.find(name);
  return it == users_.end() ? nullptr : &it->second;
}

uint32_t PrefixStore::acquire_namespace(const std::string& key) {
  auto it = namespace_ids_.find(key);
  if (it == namespace_ids_.end()) {
    uint32_t id = uint32_t(namespaces_.size());
    if (!free_namespace_ids_.empty()) {
      id = free_namespace_ids_.back();
      free_namespace_ids_.pop_back();
    } else {
      namespaces_.emplace_back();
    }
    namespaces_[id] = {key, 0};
    it = namespace_ids_.emplace(key, id).first;
  }
  ++namespaces_[it->second].holders;
  return it->second;
}

void PrefixStore::release_namespace(uint32_t id) {
  NamespaceSlot& slot = namespaces_.at(id);
  if (--slot.holders > 0) return;
  // No block and no sequence uses the id any more: it can stand for another key.
  namespace_ids_.erase(slot.key);
  slot.key.clear();
  free_namespace_ids_.push_back(id);
}

std::optional<uint32_t> PrefixStore::find_namespace(const std::string& key) const {
  auto it = namespace_ids_.find(key);
  if (it == namespace_ids_.end()) return std::nullopt;
  return it->second;
}

Match PrefixStore::match(std::span<const int32_t> tokens, int64_t max_blocks,
                         std::span<const uint32_t> namespaces) const {
  Match m;
  max_blocks = std::min<int64_t>(max_blocks, int64_t(tokens.size()) / block_size_);
  uint64_t parent = kRootHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(size_t(i * block_size_), size_t(block_size_));
    const uint64_t h = chain_hash(parent, block_tokens);
    int32_t found = -1;
    for (uint32_t ns : namespaces) {
      auto it = index_.find(Key{h, ns});
      if (it == index_.end()) continue;
      const BlockInfo& info = info_[size_t(it->second)];
      const int32_t* stored = tokens_.data() + size_t(it->second) * size_t(block_size_);
      if (info.parent == parent && std::equal(block_tokens.begin(), block_tokens.end(), stored)) {
        found = it->second;
        break;
      }
    }
    if (found < 0) break;
    m.blocks.push_back(found);
    m.hashes.push_back(h);
    parent = h;
  }
  return m;
}

void PrefixStore::acquire(int32_t block) {
  if (pool_.ref_count(block) > 0) {
    pool_.retain(block);
    return;
  }
  BlockInfo& info = info_.at(size_t(block));
  if (!info.cached) throw Error("cache prefix_lru: acquire of block " + std::to_string(block) + ", which is free and not cached");
  forget_evictable(*info.owner, info.tick, block);
  pool_.take(block);
}

std::vector<int32_t> PrefixStore::allocate(int64_t n) {
  if (n > pool_.num_free()) {
    throw Error("cache prefix_lru: cannot allocate " + std::to_string(n) + " blocks: only " +
                std::to_string(pool_.num_free()) + " of " + std::to_string(pool_.num_blocks()) + " are free");
  }
  std::vector<int32_t> out;
  out.reserve(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    if (free_uncached_.empty()) evict(pick_victim());
    const int32_t b = free_uncached_.back();
    free_uncached_.pop_back();
    pool_.take(b);
    out.push_back(b);
  }
  return out;
}

void PrefixStore::release(int32_t block) {
  if (!pool_.release(block)) return;
  BlockInfo& info = info_[size_t(block)];
  if (info.cached) {
    info.tick = ++clock_;
    info.owner->evictable.insert({info.tick, block});
    owners_of_evictable_.insert(info.owner);
  } else {
    free_uncached_.push_back(block);
  }
}

PrefixStore::Insert PrefixStore::insert(int32_t block, uint64_t parent, std::span<const int32_t> block_tokens,
                                        uint32_t ns, UserState& owner) {
  BlockInfo& info = info_.at(size_t(block));
  if (info.cached || pool_.ref_count(block) == 0 || int64_t(block_tokens.size()) != block_size_) {
    throw Error("cache prefix_lru: insert of block " + std::to_string(block) + ", which is cached, free or not full");
  }
  const uint64_t h = chain_hash(parent, block_tokens);
  if (index_.count(Key{h, ns}) != 0) return Insert::duplicate;
  if (owner.stats.cached_blocks >= cap_blocks_) {
    if (owner.evictable.empty()) return Insert::over_quota;
    evict(owner.evictable.begin()->second);  // its own least recently used block makes room
  }
  info.cached = true;
  info.ns = ns;
  info.hash = h;
  info.parent = parent;
  info.owner = &owner;
  std::copy(block_tokens.begin(), block_tokens.end(), tokens_.begin() + size_t(block) * size_t(block_size_));
  index_.emplace(Key{h, ns}, block);
  ++namespaces_.at(ns).holders;
  ++owner.stats.cached_blocks;
  return Insert::inserted;
}

void PrefixStore::uncache(int32_t block) {
  BlockInfo& info = info_.at(size_t(block));
  if (!info.cached) return;
  index_.erase(Key{info.hash, info.ns});
  UserState& owner = *info.owner;
  --owner.stats.cached_blocks;
  info.cached = false;
  if (pool_.ref_count(block) == 0) {
    forget_evictable(owner, info.tick, block);
    free_uncached_.push_back(block);
  }
  info.owner = nullptr;
  release_namespace(info.ns);
  note_if_idle(owner);
}

void PrefixStore::forget_evictable(UserState& owner, uint64_t tick, int32_t block) {
  owner.evictable.erase({tick, block});
  if (owner.evictable.empty()) owners_of_evictable_.erase(&owner);
}

void PrefixStore::evict(int32_t block) {
  ++info_.at(size_t(block)).owner->stats.evictions;  // before uncache, which may forget the owner
  ++evictions_;
  uncache(block);
}

int32_t PrefixStore::pick_victim() const {
  // Users above their floor (min_share) first, then — only when nothing else is left — blocks under
  // a floor; the least recently released block within.
  std::pair<int, uint64_t> best{std::numeric_limits<int>::max(), 0};
  int32_t victim = -1;
  for (const UserState* u : owners_of_evictable_) {
    const std::pair<int, uint64_t> key{u->stats.cached_blocks > floor_blocks_ ? 0 : 1, u->evictable.begin()->first};
    if (key < best) {
      best = key;
      victim = u->evictable.begin()->second;
    }
  }
  if (victim < 0) throw Error("cache prefix_lru: no block to evict (free-block accounting is broken)");
  return victim;
}

}  // namespace tessera::prefix
