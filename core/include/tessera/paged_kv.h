// What every paged KV cache plugin shares: its sizing parameters (block_size, memory, memory_share,
// max_seqs) and the K/V memory they size — one pool of fixed-size blocks per layer for K and one for
// V, laid out as kv_layout.h describes. Block bookkeeping (BlockPool, tables, prefix reuse) stays in
// the plugins; this is only the memory under it, so paged and prefix caches size pools identically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/cache.h"
#include "tessera/device_buffer.h"
#include "tessera/params.h"

namespace tessera {

struct __attribute__((visibility("default"))) PagedKvParams {
  int64_t block_size = 16;
  int64_t memory = 0;        // bytes; 0 = use memory_share
  double memory_share = 0;   // of the device's memory; > 0 replaces memory
  int64_t max_seqs = 0;      // 0 = limited only by blocks

  // The declarations a paged cache factory registers (defaults: 16 tokens, 256MiB, no share, no cap).
  static std::vector<ParamSpec> specs();
  // Reads and checks the values; errors start with "cache <plugin>:" and name the parameter.
  static PagedKvParams from(const Params& p, const std::string& plugin);
};

class __attribute__((visibility("default"))) PagedKvStorage {
 public:
  // Sizes the pool (memory, or memory_share of the backend's first device) and allocates K and V for
  // every layer. Throws tessera::Error naming the sizes when not even one block fits.
  void allocate(Backend& backend, const CacheGeometry& geometry, const PagedKvParams& params,
                const std::string& plugin);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  size_t block_bytes() const { return 2 * layer_block_bytes_ * k_.size(); }  // K and V, all layers
  KvLayerView layer(int64_t index) const;  // throws for an out-of-range layer
  // Copies block `src`'s K and V in every layer onto block `dst` (copy-on-write of a shared block).
  void copy_block(int32_t dst, int32_t src);

 private:
  std::string plugin_;
  Backend* backend_ = nullptr;
  CacheGeometry geometry_;
  int64_t block_size_ = 0;
  int64_t num_blocks_ = 0;
  size_t layer_block_bytes_ = 0;  // one layer's K (or V) for one block
  std::vector<DeviceBuffer> k_, v_;
};

}  // namespace tessera
