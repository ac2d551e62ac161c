#include "tessera/component.h"

#include <cmath>
#include <cstdint>
#include <sstream>

#include "tessera/backend.h"
#include "tessera/cache.h"
#include "tessera/decoder.h"
#include "tessera/error.h"

namespace tessera {

std::string_view kind_name(ComponentKind k) {
  switch (k) {
    case ComponentKind::backend: return "backend";
    case ComponentKind::quantizer: return "quantizer";
    case ComponentKind::attention: return "attention";
    case ComponentKind::cache: return "cache";
    case ComponentKind::scheduler: return "scheduler";
    case ComponentKind::decoder: return "decoder";
    case ComponentKind::constraint: return "constraint";
    case ComponentKind::comm: return "comm";
  }
  return "?";
}

bool parse_kind(std::string_view text, ComponentKind* out) {
  for (auto k : {ComponentKind::backend, ComponentKind::quantizer, ComponentKind::attention,
                 ComponentKind::cache, ComponentKind::scheduler, ComponentKind::decoder,
                 ComponentKind::constraint, ComponentKind::comm}) {
    if (kind_name(k) == text) {
      *out = k;
      return true;
    }
  }
  return false;
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::embedding: return "embedding";
    case Op::gemm: return "gemm";
    case Op::rms_norm: return "rms_norm";
    case Op::rope: return "rope";
    case Op::silu_mul: return "silu_mul";
    case Op::add: return "add";
    case Op::softmax: return "softmax";
    case Op::kv_write: return "kv_write";
    case Op::attention: return "attention";
    case Op::argmax: return "argmax";
    case Op::sparse_attention: return "sparse_attention";
    case Op::gelu_mul: return "gelu_mul";
    case Op::add_rows: return "add_rows";
    case Op::scale: return "scale";
    case Op::rope_freqs: return "rope_freqs";
  }
  return "?";
}

size_t CacheGeometry::bytes_per_token() const {
  return static_cast<size_t>(2 * n_layers * n_kv_heads * head_dim) * dtype_block_bytes(dtype) /
         static_cast<size_t>(dtype_block_elems(dtype));
}

void validate_sampling(const SamplingParams& p) {
  auto bad = [](const std::string& field, double v, const std::string& rule) {
    // 1.5, -1, nan, 1000000: as the user wrote it, not "1.500000" or "1e+06".
    std::ostringstream value;
    if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15) {
      value << int64_t(v);
    } else {
      value << v;
    }
    throw Error("invalid sampling parameter " + field + "=" + value.str() + ": " + rule);
  };
  // Written as !(in range) so that NaN is refused too.
  if (!(p.temperature >= 0.0 && p.temperature <= 100.0)) bad("temperature", p.temperature, "must be in [0, 100]");
  if (p.top_k < 0) bad("top_k", double(p.top_k), "must be >= 0 (0 disables it)");
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) bad("top_p", p.top_p, "must be in (0, 1]");
  if (!(p.min_p >= 0.0 && p.min_p <= 1.0)) bad("min_p", p.min_p, "must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0 && p.repetition_penalty <= 100.0)) {
    bad("repetition_penalty", p.repetition_penalty, "must be in (0, 100] (1 disables it)");
  }
  if (!(p.frequency_penalty >= -2.0 && p.frequency_penalty <= 2.0)) {
    bad("frequency_penalty", p.frequency_penalty, "must be in [-2, 2] (0 disables it)");
  }
  if (!(p.presence_penalty >= -2.0 && p.presence_penalty <= 2.0)) {
    bad("presence_penalty", p.presence_penalty, "must be in [-2, 2] (0 disables it)");
  }
  if (p.logprobs < -1 || p.logprobs > 20) bad("logprobs", double(p.logprobs), "must be in [0, 20], or -1 for none");
}

}  // namespace tessera
