// The CPU backend's choices of kernel for its int8 and int4 gemms, as the quantizers' `kernel`
// parameter names them, and the WeightView::kernel_variant each becomes (kernels_cpu/kernels_cpu.h
// owns the numbers). Other backends take variant 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

inline const std::vector<std::string>& cpu_int_kernels() {
  static const std::vector<std::string> names = {"auto", "vnni", "avx2", "reference"};
  return names;
}

// The int8 gemm has one more: oneDNN's s8 matmul.
inline const std::vector<std::string>& cpu_int8_kernels() {
  static const std::vector<std::string> names = {"auto", "vnni", "avx2", "reference", "dnnl"};
  return names;
}

// auto: the fastest the CPU has (vnni, else avx2, else scalar; the int8 gemm's prefill on AMX where
// there is AMX-INT8); vnni: AVX-512 VNNI's vpdpbusd,
// refused on CPUs without it; avx2: vpmaddubsw even where VNNI is there; reference: scalar; dnnl
// (int8 only): oneDNN's matmul, refused by builds without oneDNN and on CPUs without VNNI.
inline int32_t cpu_int_kernel_variant(const std::string& name) {
  if (name == "dnnl") return 1;
  if (name == "reference") return 2;
  if (name == "avx2") return 3;
  if (name == "vnni") return 4;
  return 0;
}

inline constexpr const char* kCpuInt8DnnlDoc =
    ", or dnnl (oneDNN's int8 matmul: in builds configured with oneDNN, on CPUs with AVX-512 VNNI; slower for "
    "decode, kept to compare)";

inline constexpr const char* kCpuIntKernelDoc =
    "auto (the fastest this CPU has: vnni, else avx2, else scalar), vnni (AVX-512 VNNI vpdpbusd; refused on CPUs "
    "without it), avx2 (vpmaddubsw, even where the CPU has VNNI; scalar without AVX2) or reference (scalar)";

}  // namespace tessera
