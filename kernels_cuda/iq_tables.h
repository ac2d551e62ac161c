// Host side of the IQ2/IQ3 grid formats on the GPU: the codebooks and sign table of
// tessera/iq_grids.h laid out as gguf::IqTables says, for the backend to upload once (and for the
// host test of the decoders to use as is).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gguf_blocks.cuh"
#include "tessera/iq_grids.h"

namespace tessera::gpu {

// 8-byte aligned storage (the grids are read as u64 and u32).
inline std::vector<uint64_t> iq_table_bytes() {
  using T = gguf::IqTables;
  std::vector<uint64_t> words(T::kBytes / 8);
  auto* out = reinterpret_cast<uint8_t*>(words.data());
  std::memcpy(out + T::kIq2Xxs, kIq2XxsGrid, sizeof(kIq2XxsGrid));
  std::memcpy(out + T::kIq2Xs, kIq2XsGrid, sizeof(kIq2XsGrid));
  std::memcpy(out + T::kIq2S, kIq2SGrid, sizeof(kIq2SGrid));
  std::memcpy(out + T::kIq3Xxs, kIq3XxsGrid, sizeof(kIq3XxsGrid));
  std::memcpy(out + T::kIq3S, kIq3SGrid, sizeof(kIq3SGrid));
  std::memcpy(out + T::kSigns, kIqSigns, sizeof(kIqSigns));
  static_assert(T::kIq2Xs == T::kIq2Xxs + sizeof(kIq2XxsGrid) && T::kIq2S == T::kIq2Xs + sizeof(kIq2XsGrid) &&
                    T::kIq3Xxs == T::kIq2S + sizeof(kIq2SGrid) && T::kIq3S == T::kIq3Xxs + sizeof(kIq3XxsGrid) &&
                    T::kSigns == T::kIq3S + sizeof(kIq3SGrid) && T::kBytes == T::kSigns + sizeof(kIqSigns),
                "IqTables offsets follow the tables' sizes");
  return words;
}

}  // namespace tessera::gpu
