#include "tessera/paged_kv.h"

#include <cmath>

#include "tessera/error.h"

namespace tessera {

std::vector<ParamSpec> PagedKvParams::specs() {
  return {{"block_size", ParamType::integer, 16, "tokens per block, 1..1024 (usually 8, 16 or 32)", {}},
          {"memory", ParamType::size, "256MiB", "KV pool size (e.g. 512MiB); 0 = use memory_share", {}},
          {"memory_share", ParamType::number, 0.0,
           "share (0..1] of the device's memory for the pool (total RAM on cpu); when > 0 it replaces memory", {}},
          {"max_seqs", ParamType::integer, 0, "sequences holding blocks at once; 0 = limited only by blocks", {}}};
}

PagedKvParams PagedKvParams::from(const Params& p, const std::string& plugin) {
  PagedKvParams out;
  out.block_size = p.get_int("block_size");
  out.memory = p.get_int("memory");
  out.memory_share = p.get_float("memory_share");
  out.max_seqs = p.get_int("max_seqs");
  const std::string who = "cache " + plugin + ": ";
  if (out.block_size < 1 || out.block_size > 1024) {
    throw Error(who + "block_size must be in 1..1024 (usually 8, 16 or 32), got " + std::to_string(out.block_size));
  }
  if (!(out.memory_share >= 0.0 && out.memory_share <= 1.0)) {
    throw Error(who + "memory_share must be in [0, 1] (a share of the device's memory), got " +
                std::to_string(out.memory_share));
  }
  if (out.memory == 0 && out.memory_share == 0.0) {
    throw Error(who + "memory is 0 and memory_share is 0; give one of them (e.g. memory: 512MiB)");
  }
  if (out.max_seqs < 0) throw Error(who + "max_seqs must be >= 0 (0 = no limit), got " + std::to_string(out.max_seqs));
  return out;
}

void PagedKvStorage::allocate(Backend& backend, const CacheGeometry& g, const PagedKvParams& params,
                              const std::string& plugin) {
  plugin_ = plugin;
  int64_t memory = params.memory;
  std::string source = "memory " + std::to_string(params.memory) + " bytes";
  if (params.memory_share > 0.0) {
    const auto devices = backend.devices();
    const size_t device_bytes = devices.empty() ? 0 : devices[0].memory_bytes;
    if (device_bytes == 0) {
      throw Error("cache " + plugin + ": memory_share needs the device's memory size, which backend '" +
                  std::string(backend.name()) + "' does not report; give memory instead");
    }
    memory = static_cast<int64_t>(std::floor(params.memory_share * double(device_bytes)));
    source = "memory_share " + std::to_string(params.memory_share) + " of " + std::to_string(device_bytes) +
             " bytes (" + std::to_string(memory) + " bytes)";
  }
  // One layer's K (or V) for one block: [block_size][n_kv_heads][head_dim].
  const size_t layer_block_bytes = dtype_row_bytes(g.dtype, g.n_kv_heads * g.head_dim) * size_t(params.block_size);
  const size_t block_bytes = 2 * size_t(g.n_layers) * layer_block_bytes;
  const int64_t num_blocks = block_bytes == 0 ? 0 : memory / int64_t(block_bytes);
  // Paging exists so that the pool may be smaller than max_context x sequences: one block is the
  // minimum; a sequence that outgrows the whole pool is refused by plan() and reported by the engine.
  if (num_blocks < 1) {
    throw Error("cache " + plugin + ": " + source + " cannot hold one block of block_size " +
                std::to_string(params.block_size) + " tokens at " + std::to_string(g.bytes_per_token()) +
                " bytes per token (" + std::to_string(block_bytes) + " bytes)");
  }
  backend_ = &backend;
  geometry_ = g;
  block_size_ = params.block_size;
  num_blocks_ = num_blocks;
  layer_block_bytes_ = layer_block_bytes;
  const size_t layer_bytes = layer_block_bytes * size_t(num_blocks);
  k_.clear();
  v_.clear();
  try {
    for (int64_t l = 0; l < g.n_layers; ++l) {
      k_.emplace_back(backend, layer_bytes);
      v_.emplace_back(backend, layer_bytes);
    }
  } catch (const Error& e) {
    k_.clear();
    v_.clear();
    throw Error("cache " + plugin + ": " + source + " (" + std::to_string(num_blocks) + " blocks of " +
                std::to_string(block_bytes) + " bytes) does not fit: " + e.what());
  }
}

KvLayerView PagedKvStorage::layer(int64_t index) const {
  if (index < 0 || index >= int64_t(k_.size())) {
    throw Error("cache " + plugin_ + ": layer " + std::to_string(index) + " is out of range (" +
                std::to_string(k_.size()) + " layers)");
  }
  KvLayerView v;
  v.k = k_[size_t(index)].get();
  v.v = v_[size_t(index)].get();
  v.dtype = geometry_.dtype;
  v.num_blocks = num_blocks_;
  v.block_size = block_size_;
  v.n_kv_heads = geometry_.n_kv_heads;
  v.head_dim = geometry_.head_dim;
  return v;
}

void PagedKvStorage::copy_block(int32_t dst, int32_t src) {
  if (dst < 0 || src < 0 || dst >= num_blocks_ || src >= num_blocks_) {
    throw Error("cache " + plugin_ + ": copy of block " + std::to_string(src) + " to " + std::to_string(dst) +
                " is out of range (" + std::to_string(num_blocks_) + " blocks)");
  }
  if (dst == src) return;
  const size_t d = size_t(dst) * layer_block_bytes_, s = size_t(src) * layer_block_bytes_;
  for (size_t l = 0; l < k_.size(); ++l) {
    backend_->copy_on_device(static_cast<char*>(k_[l].get()) + d, static_cast<char*>(k_[l].get()) + s,
                             layer_block_bytes_);
    backend_->copy_on_device(static_cast<char*>(v_[l].get()) + d, static_cast<char*>(v_[l].get()) + s,
                             layer_block_bytes_);
  }
}

}  // namespace tessera
