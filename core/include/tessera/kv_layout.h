// How one layer's KV cache is laid out in backend memory: a pool of fixed-size blocks,
// each [block_size][n_kv_heads][head_dim], K and V in separate pools. A sequence's tokens live in
// the blocks listed by its block table; token t sits in block table[t / block_size] at slot
// t % block_size. A contiguous cache is the special case of one block per sequence.
#pragma once

#include <cstdint>

#include "tessera/dtype.h"

namespace tessera {

struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;

  int64_t token_stride() const { return n_kv_heads * head_dim; }
  int64_t block_stride() const { return block_size * token_stride(); }
};

}  // namespace tessera
