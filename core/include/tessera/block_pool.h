// BlockPool: the bookkeeping under every paged KV cache — which of num_blocks fixed-size blocks are
// free, and how many holders reference each of the others. It owns no device memory; a cache plugin
// maps block ids onto its KV pools. Every operation is O(1) per block.
//
// Reference counts let a prefix cache share one block between sequences: allocate() hands out
// blocks with one reference, retain() adds a holder, release() drops one and frees the block when
// the last holder is gone. Free blocks are kept in release order (least recently freed first), and
// allocate() takes from that end, so a prefix cache can leave a freed block's content indexed and
// revive it with take() until allocate() reuses it — an LRU eviction of unreferenced blocks.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// Default visibility: plugins, built with hidden symbols, call it in libtessera_core.
class __attribute__((visibility("default"))) BlockPool {
 public:
  // Throws tessera::Error when num_blocks is negative or does not fit an int32 block id.
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t num_free() const { return num_free_; }
  int64_t num_used() const { return num_blocks() - num_free_; }

  // n blocks with one reference each, all or nothing: throws tessera::Error naming the request and
  // what is free when n > num_free() (callers that must not throw check num_free() first). Blocks
  // come from the front of the free list: at first 0, 1, 2, ...; later the least recently freed.
  std::vector<int32_t> allocate(int64_t n);
  // One more reference to a block in use; throws for a free or out-of-range block.
  void retain(int32_t block);
  // One reference less; true when that was the last one and the block went back to the free list
  // (at its end: it will be the last to be reused). Throws on a free block (double free) or an
  // out-of-range one.
  bool release(int32_t block);
  // Takes a specific free block out of the free list with one reference (a prefix cache reviving a
  // block whose content it still indexes). Throws when the block is in use or out of range.
  void take(int32_t block);

  int32_t ref_count(int32_t block) const;  // 0 for a free block; throws when out of range
  bool is_free(int32_t block) const { return ref_count(block) == 0; }

 private:
  void check(int32_t block, const char* what) const;
  void unlink(int32_t block);

  // Free blocks form a doubly linked list through prev_/next_ (kNone ends it), so that take() can
  // remove one from the middle in O(1).
  static constexpr int32_t kNone = -1;
  std::vector<int32_t> refs_;
  std::vector<int32_t> prev_, next_;
  int32_t head_ = kNone, tail_ = kNone;
  int64_t num_free_ = 0;
};

}  // namespace tessera
