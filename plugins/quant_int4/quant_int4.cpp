// quantizer: int4 — group-wise 4-bit weights, packed two per byte (low nibble first), with one float
// scale (and, asymmetric, one float zero point) per group of 32, 64 or 128 input features. The
// backend multiplies from the packed form; there is no float copy of the matrix.
//
// Symmetric groups use ggml's Q4_0 convention rather than absmax/7: value = (q - 8) * scale with
// q in 0..15, starting from the grid where the value of largest magnitude m maps to -8
// (scale = m / -8), so all 16 levels are used (step amax/8 instead of amax/7). Asymmetric groups
// span [min, max]: value = (q - zero) * scale, zero kept as a float. For both, nearby grids are
// tried at load and the least-squares fit kept (see quantize_symmetric / quantize_asymmetric):
// on stories260K plain rounding gives +10% (sym) / +8% (asym) perplexity, the fit +7% / +4%.
//
// Tensors whose input features are not a multiple of the group (stories260K's ffn_down has 172)
// stay in float, as llama.cpp does, and format() says why; so do tensors matching `keep_float`.
// `overrides` give tensors matching a pattern another scheme or group size, or int8 (the `int8`
// quantizer's per-channel weights: a sensitive layer at a quarter of float's bytes).
#include <emmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
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

enum class Scheme { symmetric, asymmetric, int8, keep_float };

struct Choice {
  Scheme scheme = Scheme::symmetric;
  int64_t group_size = 32;
};

struct Rule {
  std::vector<std::string> patterns;
  Choice choice;
};

std::string scheme_tag(Scheme s) { return s == Scheme::symmetric ? "sym" : "asym"; }

// One backend buffer: scales [rows][groups], zeros [rows][groups] (asymmetric), packed nibbles
// [rows][cols/2]. Floats first so that every part is aligned without padding.
class Int4Linear final : public Linear {
 public:
  // The backend may rearrange the weights for its kernel (Backend::prepare_weight), so view() is
  // row-major only where it leaves them alone (on the CPU: kernel reference).
  Int4Linear(Backend& backend, DeviceBuffer buffer, WeightView view, Scheme scheme)
      : backend_(backend), buffer_(std::move(buffer)), view_(view), scheme_(scheme) {
    backend_.prepare_weight(view_);
  }
  void forward(const float* x, int64_t m, float* y) override { backend_.gemm(x, m, view_, y); }
  int64_t in_features() const override { return view_.cols; }
  int64_t out_features() const override { return view_.rows; }
  size_t resident_bytes() const override { return buffer_.size(); }
  std::string format() const override {
    return "int4/g" + std::to_string(view_.group_size) + "/" + scheme_tag(scheme_);
  }
  WeightView view() const override { return view_; }
  bool runs_as_gemm() const override { return true; }

 private:
  Backend& backend_;
  DeviceBuffer buffer_;
  WeightView view_;
  Scheme scheme_;
};

// A grid's levels of four elements, round(clamp(x·inv + add, 0, 15)): SSE2 (x86-64's baseline),
// rounding to nearest even as nearbyint does. Clamping first gives the same level, the bounds being
// integers.
inline __m128i grid_levels(const float* x, __m128 inv, __m128 add) {
  const __m128 v = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(x), inv), add);
  return _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(15.0f)));
}

// The four lanes of a sum, added in double.
inline double lane_sum(__m128 v) {
  alignas(16) float lane[4];
  _mm_store_ps(lane, v);
  return (double(lane[0]) + lane[1]) + (double(lane[2]) + lane[3]);
}

// The chosen grid's levels of a group of g (a multiple of 4) as bytes.
void store_levels(const float* x, int64_t g, float inv, float add, uint8_t* q) {
  for (int64_t i = 0; i < g; i += 4) {
    alignas(16) int32_t n[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(n), grid_levels(x + i, _mm_set1_ps(inv), _mm_set1_ps(add)));
    for (int k = 0; k < 4; ++k) q[i + k] = uint8_t(n[k]);
  }
}

constexpr int64_t kMaxGroup = 128;

// Symmetric: grids around ggml's (largest magnitude -> level 0, i.e. -8) and, for each, the
// least-squares scale for its levels weighted by x², so that large weights are kept accurately
// (llama.cpp's make_qx_quants, rmse_type 1). For l = q - 8 and w = x², that scale is Σwxl / Σwl²
// and leaves the error Σwx² - (Σwxl)² / Σwl², so the best grid is the one with the largest
// (Σwxl)² / Σwl²: one pass per grid. On stories260K this takes the perplexity gap from +10% (plain
// rounding) to +7%. The search runs on x / |m| (in [-1, 1]), so that x³ in float neither
// underflows nor overflows whatever the weights' magnitude; the scale is then multiplied back.
float quantize_symmetric(const float* xs, int64_t g, uint8_t* q) {
  float m = 0;  // the signed value of largest magnitude
  for (int64_t i = 0; i < g; ++i) {
    if (std::fabs(xs[i]) > std::fabs(m)) m = xs[i];
  }
  if (m == 0) {
    std::fill(q, q + g, uint8_t(8));
    return 0.0f;
  }
  const float magnitude = std::fabs(m);
  alignas(16) float x[kMaxGroup], w[kMaxGroup], wx[kMaxGroup];
  for (int64_t i = 0; i < g; ++i) {
    x[i] = xs[i] / magnitude;
    w[i] = x[i] * x[i];
    wx[i] = w[i] * x[i];
  }
  m /= magnitude;  // ±1
  const __m128 eight = _mm_set1_ps(8.0f);
  double best = -1;
  float best_scale = m / -8.0f, best_inv = -8.0f / m;
  for (int t = -10; t <= 10; ++t) {
    const float inv = -(8.0f + 0.1f * float(t)) / m;
    __m128 sxl = _mm_setzero_ps(), sll = _mm_setzero_ps();
    for (int64_t i = 0; i < g; i += 4) {
      const __m128 l = _mm_sub_ps(_mm_cvtepi32_ps(grid_levels(x + i, _mm_set1_ps(inv), eight)), eight);
      sxl = _mm_add_ps(sxl, _mm_mul_ps(_mm_load_ps(wx + i), l));
      sll = _mm_add_ps(sll, _mm_mul_ps(_mm_mul_ps(_mm_load_ps(w + i), l), l));
    }
    const double a = lane_sum(sxl), b = lane_sum(sll);
    if (b > 0 && a * a / b > best) {
      best = a * a / b;
      best_scale = float(a / b);
      best_inv = inv;
    }
  }
  store_levels(x, g, best_inv, 8.0f, q);
  return best_scale * magnitude;
}

// Asymmetric: grids spanning about [min, max]; for each, the least-squares (scale, offset) for its
// levels (unweighted, as llama.cpp's make_qkx1_quants); zero = -offset / scale is kept as a float.
// The fit leaves the error Σx² - scale·Σxq - offset·Σx, so the best grid is the one with the
// largest scale·Σxq + offset·Σx. The search runs on (x - min) / (max - min), in [0, 1], so that
// neither the weights' magnitude nor a mean far from zero costs float precision; scale and offset
// are mapped back after. Plain min/max rounding gives +8% perplexity on stories260K, this +4%.
float quantize_asymmetric(const float* xs, int64_t g, uint8_t* q, float* zero) {
  float lo = xs[0], hi = xs[0];
  for (int64_t i = 1; i < g; ++i) {
    lo = std::min(lo, xs[i]);
    hi = std::max(hi, xs[i]);
  }
  if (hi == lo) {  // a constant group: (0 - (-1)) * lo == lo
    std::fill(q, q + g, uint8_t(0));
    *zero = lo != 0 ? -1.0f : 0.0f;
    return lo;
  }
  const float range = hi - lo;
  alignas(16) float x[kMaxGroup];
  for (int64_t i = 0; i < g; ++i) x[i] = (xs[i] - lo) / range;
  // The min/max grid, kept if no fit below succeeds.
  float best_scale = 1.0f / 15.0f, best_inv = 15.0f;
  double best_offset = 0;
  __m128 vsx = _mm_setzero_ps();
  for (int64_t i = 0; i < g; i += 4) vsx = _mm_add_ps(vsx, _mm_load_ps(x + i));
  const double sx = lane_sum(vsx);
  double best = -INFINITY;
  for (int t = -10; t <= 10; ++t) {
    const float inv = 15.0f + 0.1f * float(t);
    const __m128 vinv = _mm_set1_ps(inv), add = _mm_setzero_ps();
    __m128 vsq = _mm_setzero_ps(), vsqq = _mm_setzero_ps(), vsxq = _mm_setzero_ps();
    for (int64_t i = 0; i < g; i += 4) {
      const __m128 l = _mm_cvtepi32_ps(grid_levels(x + i, vinv, add));
      vsq = _mm_add_ps(vsq, l);
      vsqq = _mm_add_ps(vsqq, _mm_mul_ps(l, l));
      vsxq = _mm_add_ps(vsxq, _mm_mul_ps(_mm_load_ps(x + i), l));
    }
    const double sq = lane_sum(vsq), sqq = lane_sum(vsqq), sxq = lane_sum(vsxq);
    // Least squares for x ≈ scale * q + offset.
    const double det = double(g) * sqq - sq * sq;
    if (det <= 0) continue;
    const double scale = (double(g) * sxq - sq * sx) / det;
    const double offset = (sx - scale * sq) / double(g);
    if (scale <= 0) continue;
    if (scale * sxq + offset * sx > best) {
      best = scale * sxq + offset * sx;
      best_scale = float(scale);
      best_offset = offset;
      best_inv = inv;
    }
  }
  store_levels(x, g, best_inv, 0.0f, q);
  // x = range·(scale·q + offset) + lo = (range·scale)·(q - zero).
  const double scale = double(best_scale) * range;
  *zero = float(-(best_offset * range + lo) / scale);
  return float(scale);
}

// Quantizes one group of g floats into q[0..g) (values 0..15); returns scale (and zero).
float quantize_group(const float* x, int64_t g, Scheme scheme, uint8_t* q, float* zero) {
  return scheme == Scheme::symmetric ? quantize_symmetric(x, g, q) : quantize_asymmetric(x, g, q, zero);
}

class Int4Quantizer final : public Quantizer {
 public:
  explicit Int4Quantizer(const Params& p)
      : keep_float_(p.get_string_list("keep_float")),
        cpu_variant_(cpu_int_kernel_variant(p.get_string("kernel"))) {
    base_.group_size = checked_group(p.get_int("group_size"), "group_size");
    base_.scheme = parse_scheme(p.get_string("scheme"), "scheme");
    parse_overrides(p.get("overrides"));
  }

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    return build(backend, w, choice_for(w.name));
  }

  // Rows are quantized one by one, so parts with one choice (scheme and group size) join.
  std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) override {
    const auto joined = JoinedWeight::join(parts);
    if (!joined) return nullptr;
    const Choice c = choice_for(parts[0].name);
    for (const WeightSource& p : parts) {
      const Choice other = choice_for(p.name);
      if (other.scheme != c.scheme || other.group_size != c.group_size) return nullptr;
    }
    return build(backend, joined->source(), c);
  }

 private:
  std::unique_ptr<Linear> build(Backend& backend, const WeightSource& w, const Choice& c) {
    if (c.scheme == Scheme::keep_float) return make_float(backend, w, "keep_float");
    if (c.scheme == Scheme::int8) return make_int8_linear(backend, w, cpu_variant_, "quantizer 'int4' (override int8)");
    if (w.cols % c.group_size != 0) {
      return make_float(backend, w, "fallback: " + std::to_string(w.cols) + " cols not a multiple of " +
                                        std::to_string(c.group_size));
    }
    if (!backend.supports(Op::gemm, DType::I4)) {
      throw Error("quantizer 'int4' needs gemm on int4 weights, which the " + std::string(backend.name()) +
                  " backend lacks (tensor " + w.name + ")");
    }
    const int64_t groups = w.cols / c.group_size;
    const bool asym = c.scheme == Scheme::asymmetric;
    const size_t scale_bytes = size_t(w.rows * groups) * sizeof(float);
    const size_t packed_bytes = size_t(w.rows) * size_t(w.cols / 2);
    std::vector<uint8_t> host(scale_bytes * (asym ? 2 : 1) + packed_bytes);
    auto* scales = reinterpret_cast<float*>(host.data());
    float* zeros = asym ? scales + w.rows * groups : nullptr;
    uint8_t* packed = host.data() + scale_bytes * (asym ? 2 : 1);

    // Rows are independent (and the grid searches take ~1 s for a 110m model on two cores),
    // so they are shared across the OpenMP team; each row's result does not depend on the thread.
    const size_t in_row = dtype_row_bytes(w.dtype, w.cols);
    std::exception_ptr failure;
#pragma omp parallel
    {
      std::vector<float> row(size_t(w.cols));
      std::vector<uint8_t> q(size_t(w.cols));
#pragma omp for schedule(dynamic, 16)
      for (int64_t r = 0; r < w.rows; ++r) {
        try {
          dequantize_row(w.dtype, static_cast<const uint8_t*>(w.data) + size_t(r) * in_row, row.data(), w.cols);
        } catch (...) {  // an exception must not leave the parallel region
#pragma omp critical
          failure = std::current_exception();
          continue;
        }
        for (int64_t gi = 0; gi < groups; ++gi) {
          float zero = 0;
          const int64_t at = gi * c.group_size;
          scales[r * groups + gi] = quantize_group(row.data() + at, c.group_size, c.scheme, q.data() + at, &zero);
          if (asym) zeros[r * groups + gi] = zero;
        }
        uint8_t* out = packed + size_t(r) * size_t(w.cols / 2);
        for (int64_t i = 0; i < w.cols / 2; ++i) out[i] = uint8_t(q[size_t(2 * i)] | (q[size_t(2 * i + 1)] << 4));
      }
    }
    if (failure) std::rethrow_exception(failure);

    DeviceBuffer buf(backend, host.size());
    buf.upload(host.data(), host.size());
    auto* base = buf.as<uint8_t>();
    WeightView view;
    view.dtype = DType::I4;
    view.rows = w.rows;
    view.cols = w.cols;
    view.group_size = c.group_size;
    view.scales = reinterpret_cast<const float*>(base);
    view.zeros = asym ? reinterpret_cast<const float*>(base + scale_bytes) : nullptr;
    view.data = base + scale_bytes * (asym ? 2 : 1);
    // Variant numbers belong to the backend; only the CPU's are known here.
    view.kernel_variant = backend.name() == "cpu" ? cpu_variant_ : 0;
    // A zero-row gemm only validates the view: a kernel this CPU lacks is refused now, naming the
    // tensor, rather than at the first step.
    if (view.kernel_variant != 0) {
      try {
        backend.gemm(nullptr, 0, view, nullptr);
      } catch (const Error& e) {
        throw Error("quantizer 'int4' (tensor " + w.name + "): " + e.what());
      }
    }
    return std::make_unique<Int4Linear>(backend, std::move(buf), view, c.scheme);
  }

  static int64_t checked_group(int64_t g, const std::string& where) {
    if (g != 32 && g != 64 && g != 128) {
      throw Error("int4: parameter '" + where + "' is " + std::to_string(g) + "; expected 32, 64 or 128");
    }
    return g;
  }

  static Scheme parse_scheme(const std::string& s, const std::string& where) {
    if (s == "symmetric") return Scheme::symmetric;
    if (s == "asymmetric") return Scheme::asymmetric;
    if (s == "int8") return Scheme::int8;
    if (s == "float") return Scheme::keep_float;
    throw Error("int4: parameter '" + where + "' is \"" + s + "\"; expected symmetric, asymmetric, int8 or float");
  }

  // overrides: [{pattern: "blk.0.*" (or a list), scheme: asymmetric|symmetric|int8|float, group_size: 64}]
  void parse_overrides(const nlohmann::json& list) {
    if (list.is_null()) return;
    if (!list.is_array()) throw Error("int4: parameter 'overrides' must be a list of {pattern, scheme, group_size}");
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& item = list[i];
      const std::string where = "overrides[" + std::to_string(i) + "]";
      if (!item.is_object()) throw Error("int4: " + where + " must be a map with 'pattern'");
      Rule rule{{}, base_};
      for (const auto& [key, v] : item.items()) {
        if (key == "pattern") {
          if (v.is_string()) {
            rule.patterns.push_back(v.get<std::string>());
          } else if (v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_string(); })) {
            for (const auto& e : v) rule.patterns.push_back(e.get<std::string>());
          } else {
            throw Error("int4: " + where + "." + key + " must be a string or a list of strings");
          }
        } else if (key == "scheme") {
          if (!v.is_string()) throw Error("int4: " + where + ".scheme must be a string");
          rule.choice.scheme = parse_scheme(v.get<std::string>(), where + ".scheme");
        } else if (key == "group_size") {
          if (!v.is_number_integer()) throw Error("int4: " + where + ".group_size must be an integer");
          rule.choice.group_size = checked_group(v.get<int64_t>(), where + ".group_size");
        } else {
          throw Error("int4: " + where + ": unknown key '" + key + "' (known: pattern, scheme, group_size)");
        }
      }
      if (rule.patterns.empty()) throw Error("int4: " + where + " has no 'pattern'");
      rules_.push_back(std::move(rule));
    }
  }

  // keep_float wins, then the first matching override, then the defaults.
  Choice choice_for(const std::string& name) const {
    if (tensor_matches_any(keep_float_, name)) return {Scheme::keep_float, base_.group_size};
    for (const Rule& r : rules_) {
      if (tensor_matches_any(r.patterns, name)) return r.choice;
    }
    return base_;
  }

  static std::unique_ptr<Linear> make_float(Backend& backend, const WeightSource& w, const std::string& why) {
    return make_float_linear(backend, w, std::nullopt, "quantizer 'int4' (" + why + ")", why);
  }


  Choice base_;
  std::vector<std::string> keep_float_;
  int32_t cpu_variant_;
  std::vector<Rule> rules_;
};

void register_int4(Registrar& r) {
  r.add<Quantizer>(
      "int4",
      "Group-wise 4-bit weights (two per byte, float scale per group; asymmetric adds a zero point), "
      "multiplied from the packed form",
      {{"group_size", ParamType::integer, 32, "input features per scale group: 32, 64 or 128"},
       {"scheme", ParamType::string, "symmetric",
        "symmetric (q-8)*scale, ggml Q4_0 rounding; asymmetric (q-zero)*scale over each group's [min, max]",
        {"symmetric", "asymmetric"}},
       {"keep_float", ParamType::string_list, nlohmann::json::array(),
        "tensor-name patterns kept in float, e.g. [output, \"blk.0.*\"]"},
       {"overrides", ParamType::object, nlohmann::json::array(),
        "list of {pattern, scheme: symmetric|asymmetric|int8|float, group_size} for tensors matching pattern "
        "(int8: the int8 quantizer's per-channel weights); the first match wins, keep_float before all"},
       {"kernel", ParamType::string, "auto",
        std::string("CPU kernel: ") + kCpuIntKernelDoc +
            ". vnni and avx2 quantize x to int8 per block of 32 and read weights packed in 8-row bands, with the "
            "same results; reference computes in float on row-major weights. Other backends use their own",
        cpu_int_kernels()}},
      [](const Params& p) { return std::make_unique<Int4Quantizer>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("quant_int4", tessera::register_int4)
