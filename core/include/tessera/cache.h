// Cache: owns the KV memory. Transactional: plan() answers "does this fit?" without changing
// anything (an empty optional means no); only commit() changes state. release() gives a sequence's
// blocks back (finished, cancelled or preempted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/backend.h"
#include "tessera/kv_layout.h"

namespace tessera {

using SeqId = uint64_t;

struct CacheGeometry {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_context = 0;  // longest sequence the model accepts
  DType dtype = DType::F32;
  size_t bytes_per_token() const;  // K and V over all layers
};

// Grow `seq` so that it can hold `total_tokens` tokens. `tokens` are the sequence's token ids so
// far (prompt and output), which a prefix cache hashes; `user` and `retain` drive isolation.
struct CacheRequest {
  SeqId seq = 0;
  int64_t total_tokens = 0;
  std::span<const int32_t> tokens;
  std::string user = "anonymous";
  bool retain = true;
};

struct CacheGrant {
  SeqId seq = 0;
  int64_t new_blocks = 0;     // blocks the commit will take from the pool
  int64_t cached_tokens = 0;  // leading tokens whose KV is already present (prefix reuse)
};

struct CachePlan {
  std::vector<CacheRequest> requests;
  std::vector<CacheGrant> grants;  // one per request, same order
};

// Prefix reuse counters (zero for caches that do not reuse), globally and per user.
struct PrefixStats {
  int64_t lookups = 0;          // requests that looked up a prefix
  int64_t lookup_tokens = 0;    // prompt tokens those requests brought
  int64_t hit_tokens = 0;       // of which were found cached (= prefill tokens saved)
  int64_t cached_blocks = 0;    // full blocks held for reuse now
  int64_t evictions = 0;        // cached blocks evicted to make room
  double hit_rate() const { return lookup_tokens == 0 ? 0.0 : double(hit_tokens) / double(lookup_tokens); }
};

struct CacheStats {
  int64_t block_size = 0;
  int64_t blocks_total = 0;
  int64_t blocks_used = 0;
  int64_t sequences = 0;
  size_t bytes_total = 0;
  size_t bytes_used = 0;
  int64_t tokens_stored = 0;   // tokens whose KV the pool holds
  int64_t slots_allocated = 0;  // token slots in allocated blocks
  int64_t max_seq_tokens = 0;   // most tokens one sequence can hold (0: no bound but the pool's)
  PrefixStats prefix;
  std::map<std::string, PrefixStats> users;
  double fragmentation() const {  // share of allocated slots that hold no token
    return slots_allocated == 0 ? 0.0 : 1.0 - double(tokens_stored) / double(slots_allocated);
  }
};

class Cache {
 public:
  virtual ~Cache() = default;
  // Allocates the pool on the backend; throws tessera::Error naming the sizes when the memory it was
  // given cannot hold its smallest unit (a block, or a contiguous slot).
  virtual void configure(Backend& backend, const CacheGeometry& geometry) = 0;
  virtual std::optional<CachePlan> plan(std::span<const CacheRequest> requests) = 0;
  virtual void commit(const CachePlan& plan) = 0;
  // Records that the first `tokens` tokens of `seq` now hold valid KV.
  virtual void mark_computed(SeqId seq, int64_t tokens) = 0;
  virtual void release(SeqId seq) = 0;
  // Forgets the KV of `seq` past its first `tokens` tokens (rejected speculative tokens) and gives
  // back the blocks no longer needed.
  virtual void truncate(SeqId seq, int64_t tokens) = 0;
  virtual KvLayerView layer(int64_t index) const = 0;
  virtual std::span<const int32_t> block_table(SeqId seq) const = 0;
  virtual CacheStats stats() const = 0;
};

}  // namespace tessera
