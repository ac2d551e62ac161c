// Quantizer: turns a weight matrix from the model file into a backend-resident Linear that computes
// y = x·Wᵀ through backend kernels. Per-layer choices (keep sensitive layers in float) are made
// here, by tensor name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tessera/backend.h"
#include "tessera/dtype.h"

namespace tessera {

// A weight as stored in the model file (host memory, usually the mapped file).
struct WeightSource {
  std::string name;  // e.g. "blk.0.attn_q.weight"
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
};

class Linear {
 public:
  virtual ~Linear() = default;
  // y[m][out_features] = x[m][in_features] · Wᵀ; x and y are backend memory.
  virtual void forward(const float* x, int64_t m, float* y) = 0;
  // forward with y's columns dealt out to `parts` (Backend::gemm_parts); false, with nothing
  // written, where this Linear has no such path: the caller runs forward and splits y itself.
  virtual bool forward_parts(const float* x, int64_t m, std::span<const OutputPart> parts) {
    (void)x, (void)m, (void)parts;
    return false;
  }
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual size_t resident_bytes() const = 0;  // backend memory held by this weight
  virtual std::string format() const = 0;     // e.g. "f32", "q8_0", "int8/channel"
  // The stored weight, for ops that read the matrix directly (tied embeddings, tests).
  virtual WeightView view() const = 0;
  // True where forward is exactly Backend::gemm on view(): the model may then run this weight in
  // one call with others that share its input (Backend::gemv_many).
  virtual bool runs_as_gemm() const { return false; }
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  // Throws tessera::Error naming the tensor when the backend lacks the op the format needs.
  virtual std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& weight) = 0;
  // One Linear for weights that share their input (a layer's q, k, v; gate and up): its output
  // features are the parts' in the order given, each stored and computed as the part's own Linear
  // would, float kernels perhaps summing in another order (tessera/joined_weight.h joins them).
  // Null where this quantizer would store the parts differently (a per-tensor rule singles one
  // out, their types differ): the model keeps them apart.
  virtual std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) {
    (void)backend;
    (void)parts;
    return nullptr;
  }
};

}  // namespace tessera
