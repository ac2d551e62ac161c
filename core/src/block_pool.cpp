#include "tessera/block_pool.h"

#include <limits>
#include <string>

#include "tessera/error.h"

namespace tessera {

BlockPool::BlockPool(int64_t num_blocks) {
  if (num_blocks < 0 || num_blocks > std::numeric_limits<int32_t>::max()) {
    throw Error("block pool: " + std::to_string(num_blocks) + " blocks is out of range (0.." +
                std::to_string(std::numeric_limits<int32_t>::max()) + ")");
  }
  const auto n = static_cast<size_t>(num_blocks);
  refs_.assign(n, 0);
  prev_.resize(n);
  next_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    prev_[i] = static_cast<int32_t>(i) - 1;
    next_[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : kNone;
  }
  if (n > 0) {
    head_ = 0;
    tail_ = static_cast<int32_t>(n - 1);
  }
  num_free_ = num_blocks;
}

void BlockPool::check(int32_t block, const char* what) const {
  if (block < 0 || block >= num_blocks()) {
    throw Error(std::string("block pool: ") + what + " of block " + std::to_string(block) +
                ", which is out of range (the pool has " + std::to_string(num_blocks()) + " blocks)");
  }
}

void BlockPool::unlink(int32_t block) {
  const int32_t p = prev_[size_t(block)], n = next_[size_t(block)];
  (p == kNone ? head_ : next_[size_t(p)]) = n;
  (n == kNone ? tail_ : prev_[size_t(n)]) = p;
  --num_free_;
}

std::vector<int32_t> BlockPool::allocate(int64_t n) {
  if (n < 0) throw Error("block pool: cannot allocate " + std::to_string(n) + " blocks");
  if (n > num_free_) {
    throw Error("block pool: cannot allocate " + std::to_string(n) + " blocks: only " + std::to_string(num_free_) +
                " of " + std::to_string(num_blocks()) + " are free");
  }
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    unlink(b);
    refs_[size_t(b)] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::retain(int32_t block) {
  check(block, "retain");
  if (refs_[size_t(block)] == 0) {
    throw Error("block pool: retain of block " + std::to_string(block) + ", which is free (allocate or take it first)");
  }
  ++refs_[size_t(block)];
}

bool BlockPool::release(int32_t block) {
  check(block, "release");
  int32_t& r = refs_[size_t(block)];
  if (r == 0) throw Error("block pool: release of block " + std::to_string(block) + ", which is already free (double free)");
  if (--r > 0) return false;
  // Append at the tail: the most recently freed block is the last to be reused.
  prev_[size_t(block)] = tail_;
  next_[size_t(block)] = kNone;
  (tail_ == kNone ? head_ : next_[size_t(tail_)]) = block;
  tail_ = block;
  ++num_free_;
  return true;
}

void BlockPool::take(int32_t block) {
  check(block, "take");
  if (refs_[size_t(block)] != 0) {
    throw Error("block pool: take of block " + std::to_string(block) + ", which is in use (" +
                std::to_string(refs_[size_t(block)]) + " references; retain it instead)");
  }
  unlink(block);
  refs_[size_t(block)] = 1;
}

int32_t BlockPool::ref_count(int32_t block) const {
  check(block, "ref_count");
  return refs_[size_t(block)];
}

}  // namespace tessera
