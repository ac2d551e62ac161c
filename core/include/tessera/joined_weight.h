// Weights that share their input (a layer's q, k and v; gate and up), joined row after row into
// one: what a Quantizer's make_fused_linear builds from. The model then runs one GEMM where it ran
// several, which on a CPU decode saves each part's fork and join and its pass over x.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/quantizer.h"

namespace tessera {

class JoinedWeight {
 public:
  // nullopt unless there are at least two parts, all of one type and one number of columns.
  static std::optional<JoinedWeight> join(std::span<const WeightSource> parts);

  // Over this object's copy of the rows; its name lists the parts ("a + b + c").
  WeightSource source() const;

 private:
  std::vector<uint8_t> bytes_;
  WeightSource shape_;  // name, type and shape; data is bytes_
};

}  // namespace tessera
