#include "tessera/joined_weight.h"

#include <cstring>

#include "tessera/dtype.h"

namespace tessera {

std::optional<JoinedWeight> JoinedWeight::join(std::span<const WeightSource> parts) {
  if (parts.size() < 2) return std::nullopt;
  JoinedWeight j;
  j.shape_.dtype = parts[0].dtype;
  j.shape_.cols = parts[0].cols;
  for (const WeightSource& p : parts) {
    if (p.dtype != j.shape_.dtype || p.cols != j.shape_.cols) return std::nullopt;
    j.shape_.name += (j.shape_.name.empty() ? "" : " + ") + p.name;
    j.shape_.rows += p.rows;
  }
  const size_t row_bytes = dtype_row_bytes(j.shape_.dtype, j.shape_.cols);
  j.bytes_.resize(row_bytes * size_t(j.shape_.rows));
  size_t at = 0;
  for (const WeightSource& p : parts) {
    const size_t n = row_bytes * size_t(p.rows);
    if (n > 0) std::memcpy(j.bytes_.data() + at, p.data, n);
    at += n;
  }
  return j;
}

WeightSource JoinedWeight::source() const {
  WeightSource w = shape_;
  w.data = bytes_.data();
  return w;
}

}  // namespace tessera
