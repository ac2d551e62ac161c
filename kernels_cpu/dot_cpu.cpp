#include <immintrin.h>

#include <cstdlib>
#include <string>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

bool has_avx2() {
  static const bool value = [] {
    __builtin_cpu_init();
    return isa_cap() != IsaCap::scalar && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return value;
}

IsaCap isa_cap() {
  static const IsaCap value = [] {
    const char* cap = std::getenv("TESSERA_CPU_ISA");
    if (cap == nullptr || *cap == '\0') return IsaCap::none;  // set but empty: as unset
    if (std::string(cap) == "avx2") return IsaCap::avx2;
    if (std::string(cap) == "vnni") return IsaCap::vnni;
    if (std::string(cap) == "scalar") return IsaCap::scalar;
    throw Error(std::string("TESSERA_CPU_ISA is '") + cap +
                "': the CPU kernels take avx2 (no AVX-512, no AMX), vnni (no AMX) or scalar (no AVX2: the "
                "portable code every x86-64 CPU runs), or leave it unset for what the CPU has");
  }();
  return value;
}

bool has_avx512_vnni() {
  static const bool value = [] {
    if (isa_cap() == IsaCap::avx2) return false;  // scalar: has_avx2() is false
    __builtin_cpu_init();
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  }();
  return value;
}

StreamTuning stream_tuning() {
  static const StreamTuning value = [] {
    if (const char* env = std::getenv("TESSERA_CPU_TUNING"); env != nullptr && *env != '\0') {  // empty: as unset
      if (std::string(env) == "amd") return StreamTuning::amd;
      if (std::string(env) == "intel") return StreamTuning::intel;
      throw Error(std::string("TESSERA_CPU_TUNING is '") + env +
                  "': the CPU kernels' decode reads are tuned for amd or intel, or leave it unset for this CPU's vendor");
    }
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") ? StreamTuning::intel : StreamTuning::amd;
  }();
  return value;
}

const char* stream_tuning_name(StreamTuning t) { return t == StreamTuning::intel ? "intel" : "amd"; }

bool has_avx512f() {
  static const bool value = [] {
    __builtin_cpu_init();
    return isa_cap() != IsaCap::avx2 && has_avx2() && __builtin_cpu_supports("avx512f");
  }();
  return value;
}

bool vnni_for(int32_t variant, const char* gemm) {
  const int32_t v = variant & ~kKernelFlags;
  if (v == kKernelVnni && !has_avx512_vnni()) {
    throw Error(std::string("cpu gemm on ") + gemm +
                ": kernel vnni needs AVX-512 VNNI (avx512vnni, avx512vl, avx512bw), which this CPU lacks "
                "(or TESSERA_CPU_ISA=avx2 hides); use kernel auto or avx2");
  }
  return v == kKernelVnni || (v == kKernelAuto && has_avx512_vnni());
}

namespace {

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  float sum = _mm_cvtss_f32(s);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float dot_generic(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = 0;
  for (float v : acc) sum += v;
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
  return has_avx2() ? dot_avx2(a, b, n) : dot_generic(a, b, n);
}

}  // namespace tessera::cpu
