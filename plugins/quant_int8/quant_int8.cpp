// quantizer: int8 — W8A8. Weights are symmetric int8 per output channel (scale = absmax/127),
// activations are quantized per token at run time inside the backend's gemm, products accumulate
// in int32 and the output is dequantized as it is written. Tensors named by `keep_float` stay in
// floating point exactly as quantizer `none` keeps them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tessera/backend_linear.h"
#include "tessera/device_buffer.h"
#include "tessera/cpu_int_kernel.h"
#include "tessera/error.h"
#include "tessera/joined_weight.h"
#include "tessera/plugin.h"
#include "tessera/tensor_pattern.h"

namespace tessera {
namespace {

// Rows are quantized and uploaded in pieces of about this size, so loading never stages a second
// copy of a whole large matrix on the host.
constexpr size_t kStageBytes = size_t(4) << 20;

class Int8Quantizer final : public Quantizer {
 public:
  explicit Int8Quantizer(const Params& p)
      : keep_float_(p.get_string_list("keep_float")),
        cpu_variant_(cpu_int_kernel_variant(p.get_string("kernel"))) {}

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    return build(backend, w, tensor_matches_any(keep_float_, w.name));
  }

  // Rows are quantized one by one (a scale each), so parts that keep_float treats alike join.
  std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) override {
    const auto joined = JoinedWeight::join(parts);
    if (!joined) return nullptr;
    const bool keep = tensor_matches_any(keep_float_, parts[0].name);
    for (const WeightSource& p : parts) {
      if (tensor_matches_any(keep_float_, p.name) != keep) return nullptr;
    }
    return build(backend, joined->source(), keep);
  }

 private:
  std::unique_ptr<Linear> build(Backend& backend, const WeightSource& w, bool keep_float) {
    if (keep_float) {
      return make_float_linear(backend, w, std::nullopt, "quantizer 'int8' (keep_float)");
    }
    if (!backend.supports(Op::gemm, DType::I8)) {
      throw Error("quantizer 'int8' needs gemm on i8 on the " + std::string(backend.name()) +
                  " backend (tensor " + w.name + "); keep it in float with keep_float or use quantizer 'none'");
    }
    const int64_t k = w.cols;
    DeviceBuffer data(backend, size_t(w.rows) * size_t(k));
    DeviceBuffer scales(backend, size_t(w.rows) * sizeof(float));
    std::vector<float> host_scales(size_t(w.rows));
    const int64_t rows_per_stage = std::max<int64_t>(1, int64_t(kStageBytes / size_t(k)));
    std::vector<int8_t> stage(size_t(std::min(rows_per_stage, w.rows) * k));
    std::vector<float> row(static_cast<size_t>(k));
    const size_t in_row = dtype_row_bytes(w.dtype, k);
    const auto* src = static_cast<const uint8_t*>(w.data);
    for (int64_t r0 = 0; r0 < w.rows; r0 += rows_per_stage) {
      const int64_t r1 = std::min(w.rows, r0 + rows_per_stage);
      for (int64_t r = r0; r < r1; ++r) {
        dequantize_row(w.dtype, src + size_t(r) * in_row, row.data(), k);
        host_scales[size_t(r)] = quantize_row(row.data(), k, stage.data() + (r - r0) * k, w.name, r);
      }
      backend.copy_to_device(data.as<int8_t>() + r0 * k, stage.data(), size_t((r1 - r0) * k));
    }
    scales.upload(host_scales.data(), host_scales.size() * sizeof(float));
    WeightView view{data.get(), DType::I8, w.rows, w.cols, scales.as<float>()};
    // Variant numbers belong to the backend; only the CPU's are known here.
    view.kernel_variant = backend.name() == "cpu" ? cpu_variant_ : 0;
    // A zero-row gemm only validates the view: a variant this backend build lacks is refused now,
    // naming the tensor, rather than at the first step.
    if (view.kernel_variant != 0) {
      try {
        backend.gemm(nullptr, 0, view, nullptr);
      } catch (const Error& e) {
        throw Error("quantizer 'int8' (tensor " + w.name + "): " + e.what());
      }
    }
    return std::make_unique<BackendLinear>(backend, std::move(data), view, "int8", std::move(scales));
  }

  // Symmetric per-row quantization: scale = absmax/127, q = round(x/scale); an all-zero row gets
  // scale 0 and zeros.
  // Without lround (a libm call per weight was a tenth of loading a model) and without branches
  // per element, which random weights mispredict half the time.
  static float quantize_row(const float* x, int64_t k, int8_t* q, const std::string& name, int64_t r) {
    float amax = 0;
    bool finite = true;
    for (int64_t c = 0; c < k; ++c) {
      const float a = std::fabs(x[c]);
      finite &= a <= std::numeric_limits<float>::max();  // false for NaN and infinity
      amax = std::max(amax, a);
    }
    if (!finite) {
      throw Error("quantizer 'int8': tensor " + name + " has a non-finite value in row " + std::to_string(r));
    }
    const float scale = amax / 127.0f;
    if (!(scale > 0)) {
      std::fill(q, q + k, int8_t(0));
      return scale;
    }
    for (int64_t c = 0; c < k; ++c) {
      q[c] = int8_t(std::min(std::max(round_half_away(x[c] / scale), -127.0f), 127.0f));
    }
    return scale;
  }

  // std::lround's rounding (halves away from zero) for |v| < 2^23, where v - trunc(v) is exact;
  // truncating through int32 is one SSE2 instruction (std::trunc is a libm call without SSE4.1).
  static float round_half_away(float v) {
    const float t = float(int32_t(v));
    const float d = v - t;
    return t + (float(d >= 0.5f) - float(d <= -0.5f));
  }

  std::vector<std::string> keep_float_;
  int32_t cpu_variant_;
};

void register_int8(Registrar& r) {
  r.add<Quantizer>(
      "int8",
      "W8A8: int8 weights per output channel, int8 activations per token (dynamic), int32 accumulation",
      {{"keep_float", ParamType::string_list, nlohmann::json::array(),
        "tensor-name patterns kept in floating point, e.g. [output, \"blk.0.*\"]", {}},
       {"kernel", ParamType::string, "auto",
        std::string("CPU kernel: ") + kCpuIntKernelDoc + kCpuInt8DnnlDoc +
            "; all give the same results. auto runs prefills (k a multiple of 64) on AMX tiles where the CPU has "
            "AMX-INT8. Other backends use their own",
        cpu_int8_kernels()}},
      [](const Params& p) { return std::make_unique<Int8Quantizer>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("quant_int8", tessera::register_int8)
