// The CPU backend: host memory and the reference implementation of every op.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>

#include "kernels_cpu.h"
#include "tessera/error.h"
#include "tessera/host_arena.h"
#include "tessera/plugin.h"

namespace tessera::cpu {

namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

size_t total_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

constexpr int64_t kMaxThreads = 1024;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Params& params) {
    const int64_t threads = params.get_int("threads");
    if (threads < 0 || threads > kMaxThreads) {
      throw Error("threads = " + std::to_string(threads) + " is out of range (0 = all cores, or 1 to " +
                  std::to_string(kMaxThreads) + ")");
    }
    if (threads > 0) set_threads(static_cast<int>(threads));
    // A bad TESSERA_CPU_ISA or TESSERA_CPU_TUNING is refused here, not inside a kernel's team.
    isa_cap();
    stream_tuning();
  }

  std::string_view name() const override { return "cpu"; }
  std::vector<DeviceInfo> devices() const override {
    const char* isa = amx_int8_usable()   ? "avx2, avx512 vnni, amx int8"
                      : has_avx512_vnni() ? "avx2, avx512 vnni"
                      : has_avx2()        ? "avx2"
                                          : "no avx2";
    return {DeviceInfo{0, cpu_model_name() + " (" + isa + ", " + stream_tuning_name(stream_tuning()) + " tuning)",
                       total_memory()}};
  }
  bool supports(Op op, DType dtype) const override {
    switch (op) {
      case Op::gemm: return gemm_supports(dtype);
      case Op::embedding: return gemm_supports(dtype) && dtype != DType::I8 && dtype != DType::I4;
      case Op::kv_write:
      case Op::attention:
      case Op::sparse_attention: return cpu::kv_type_supported(dtype);
      default: return dtype == DType::F32;
    }
  }
  void set_threads(int threads) override {
    // OpenMP itself dies (inside GOMP_parallel) when it cannot start a team this large.
    if (threads < 1 || threads > kMaxThreads) {
      throw Error("cpu backend: " + std::to_string(threads) + " threads is out of range (1 to " +
                  std::to_string(kMaxThreads) + ")");
    }
    omp_set_num_threads(threads);
  }

  void* allocate(size_t bytes) override {
    void* p = arena_.allocate(bytes);
    if (p == nullptr) throw Error("cpu backend: out of memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void deallocate(void* ptr) noexcept override { arena_.deallocate(ptr); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void synchronize() override {}

  void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) override {
    cpu::embedding(table, ids, n, out);
  }
  void gemm(const float* x, int64_t m, const WeightView& w, float* y) override { cpu::gemm(x, m, w, y); }
  bool gemm_parts(const float* x, int64_t m, const WeightView& w, const OutputPart* parts,
                  size_t n_parts) override {
    return cpu::gemm_f32_parts(x, m, w, parts, n_parts) || cpu::gemm_i8_parts(x, m, w, parts, n_parts);
  }
  bool gemv_many(const float* x, const WeightView* views, float* const* ys, size_t n) override {
    return cpu::gemv_many(x, views, ys, n);
  }
  bool gemv_shares(const WeightView* views, size_t n) const override { return cpu::gemv_shares(views, n); }
  void gemv_share(const float* x, const WeightView* views, float* const* ys, size_t n, int t, int nt) override {
    cpu::gemv_share(x, views, ys, n, t, nt);
  }
  void prepare_weight(WeightView& w) override {
    cpu::prepare_weight(w);
    // Matrices past half an arena slab (an output head: 24.6 MB in int8, 98 MB in f32 for 110m)
    // came from malloc on small pages; streamed from them, they read 10-20% slower than from huge
    // pages on this project's VM (interleaved, 24 MiB): move them once, here.
    back_with_huge_pages(w.data, size_t(w.rows) * dtype_row_bytes(w.dtype, w.cols));
  }
  void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps) override {
    cpu::rms_norm(x, weight, out, rows, dim, eps);
  }
  void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
            int64_t rope_dim, float theta, RopeStyle style) override {
    cpu::rope(x, positions, rows, n_heads, head_dim, rope_dim, theta, style);
  }
  void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
                  int64_t rope_dim, const float* inv_freq, float mscale, RopeStyle style) override {
    cpu::rope_freqs(x, positions, rows, n_heads, head_dim, rope_dim, inv_freq, mscale, style);
  }
  void gelu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::gelu_mul(gate, up, out, n);
  }
  void add_rows(float* x, const float* row, int64_t rows, int64_t cols) override {
    cpu::add_rows(x, row, rows, cols);
  }
  void scale(float* x, float s, int64_t n) override { cpu::scale(x, s, n); }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::silu_mul(gate, up, out, n);
  }
  void add(const float* a, const float* b, float* out, int64_t n) override { cpu::add(a, b, out, n); }
  void softmax(float* x, int64_t rows, int64_t cols) override { cpu::softmax(x, rows, cols); }
  void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t rows) override {
    cpu::kv_write(kv, k, v, slots, rows);
  }
  void attention(const AttentionArgs& args, const KvLayerView& kv) override { cpu::attention(args, kv); }
  void attention_block_scores(const AttentionArgs& args, const KvLayerView& kv, float* scores) override {
    cpu::attention_block_scores(args, kv, scores);
  }
  void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out) override {
    cpu::argmax(logits, rows, cols, out);
  }

 private:
  HostArena arena_;
};

void register_cpu(Registrar& r) {
  r.add<Backend>("cpu", "Host CPU: the reference implementation of every op (AVX2; parallel regions on a spinning thread team of OpenMP's thread count)",
                 {{"threads", ParamType::integer, 0, "worker threads; 0 = OpenMP default (all cores)", {}}},
                 [](const Params& p) { return std::make_unique<CpuBackend>(p); });
}

}  // namespace

}  // namespace tessera::cpu

TESSERA_PLUGIN("kernels_cpu", tessera::cpu::register_cpu)
