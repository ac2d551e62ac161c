// The CUDA and HIP backends: device memory through the runtime API and every op of the kernel
// interface. One source serves both vendors through vendor.h (TESSERA_HIP selects HIP). On CUDA,
// float and int8 GEMMs with more than a few rows go to cuBLAS when libcublas can be opened (see
// vendor_blas.h); everything else, and everything on HIP, runs the kernels in kernels/.
//
// Ops are queued and launched at the next copy, synchronisation or free, from a CUDA graph when the
// same sequence ran before (launch_queue.h): a decode step's launches cost one graph launch.
//
// WeightView::kernel_variant for gemm on these backends:
//   0  the default: own GEMV kernels for m <= 8 (decode), vendor BLAS for larger m where available
//   1  own kernels only, for every shape (for comparisons and for checking the BLAS path)
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "iq_tables.h"
#include "kernels_gpu.h"
#include "launch_queue.h"
#include "tessera/error.h"
#include "tessera/plugin.h"
#if !defined(TESSERA_HIP)
#include "vendor_blas.h"
#endif

namespace tessera::gpu {

// The kernels take mirrors of the SDK structs; they must stay byte-compatible.
static_assert(sizeof(SeqDesc) == sizeof(AttentionSeqDesc));
static_assert(offsetof(SeqDesc, q_start) == offsetof(AttentionSeqDesc, q_start));
static_assert(offsetof(SeqDesc, q_len) == offsetof(AttentionSeqDesc, q_len));
static_assert(offsetof(SeqDesc, context_len) == offsetof(AttentionSeqDesc, context_len));
static_assert(offsetof(SeqDesc, block_table_offset) == offsetof(AttentionSeqDesc, block_table_offset));

namespace {

const std::string kBackend = TESSERA_GPU_BACKEND;
#if defined(TESSERA_HIP)
constexpr const char* kDoc = "AMD GPU through HIP (ROCm): every op; own GEMM kernels";
constexpr const char* kGraphsDoc =
    "accepted so that a pipeline runs on either vendor; HIP launches each op as it is called";
#else
constexpr const char* kDoc =
    "NVIDIA GPU through CUDA: every op; cuBLAS for large float and int8 GEMMs when libcublas loads; repeated "
    "launch sequences (decode steps) replayed as CUDA graphs";
constexpr const char* kGraphsDoc =
    "replay repeated sequences of launches (a decode step) from captured CUDA graphs; false launches each op as it "
    "is called";
#endif

constexpr int32_t kVariantDefault = 0;
constexpr int32_t kVariantOwnKernels = 1;
// Rows of x above which a GEMM goes to the vendor BLAS (below, the GEMV kernels stream the weight
// once for all rows); quantized weights are expanded to f16 for it only from kDequantMinRows rows,
// where one expansion is amortised over enough rows.
constexpr int64_t kBlasMinRows = 9;
constexpr int64_t kDequantMinRows = 64;
// Positions whose rope rotations are tabled (8192 x rope_dim / 2 x 8 bytes: 1 MiB at rope_dim 32,
// 4 MiB at 128); later positions are computed per call.
constexpr int64_t kRopeTablePositions = 8192;

[[noreturn]] void fail(const std::string& what, cudaError_t status) {
  throw Error(kBackend + " backend: " + what + " failed (" + cudaGetErrorString(status) + ")");
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(what, status);
}

// Every device the runtime reports; empty without a driver or a device. Never throws: `tessera
// plugins` and auto backend selection call it on machines with no GPU at all.
std::vector<DeviceInfo> enumerate_devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so a later call does not report a stale error
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    out.push_back(DeviceInfo{i, prop.name, static_cast<size_t>(prop.totalGlobalMem)});
  }
  return out;
}

bool gemm_dtype(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
    case DType::I8:
    case DType::I4: return true;
    default: return false;
  }
}

bool cache_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

CacheType cache_type(DType t) {
  return t == DType::F16 ? CacheType::f16 : t == DType::BF16 ? CacheType::bf16 : CacheType::f32;
}

// Grows on demand and never shrinks; stream-ordered reuse is safe because every use is enqueued on
// the backend's one stream, and a buffer is only freed after that stream drains.
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};

class GpuBackend final : public Backend {
 public:
  GpuBackend(int device, bool graphs) : device_(device) {
    check(cudaSetDevice(device_), TESSERA_GPU_API "SetDevice");
    // A non-blocking stream of our own, so work never serialises against other libraries' use of
    // the legacy default stream.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), TESSERA_GPU_API "StreamCreate");
    // Kernel-detected data errors land in host-mapped memory: reading them costs nothing at the
    // synchronisations the caller makes anyway.
    void* host = nullptr;
    check(cudaHostAlloc(&host, sizeof(DeviceStatus), cudaHostAllocMapped), TESSERA_GPU_API "HostAlloc");
    status_host_ = static_cast<DeviceStatus*>(host);
    std::memset(host, 0, sizeof(DeviceStatus));
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, host, 0), TESSERA_GPU_API "HostGetDevicePointer");
    status_dev_ = static_cast<DeviceStatus*>(dev);
    // The IQ2/IQ3 codebooks (17 KiB), read by the kernels of those weight types.
    const std::vector<uint64_t> tables = iq_table_bytes();
    void* table_dev = nullptr;
    check(cudaMalloc(&table_dev, tables.size() * 8), TESSERA_GPU_API "Malloc");
    iq_tables_ = static_cast<const uint8_t*>(table_dev);
    check(cudaMemcpyAsync(table_dev, tables.data(), tables.size() * 8, cudaMemcpyHostToDevice, stream_),
          "copy of the IQ codebooks");
    check(cudaStreamSynchronize(stream_), "copy of the IQ codebooks");
#if defined(TESSERA_HIP)
    graphs = false;  // not captured on HIP (launch_queue.h)
#else
    blas_ = VendorBlas::open(stream_, &blas_missing_);
#endif
    queue_ = std::make_unique<LaunchQueue>(stream_, !graphs);
  }
  ~GpuBackend() override {
    (void)cudaSetDevice(device_);
    try {
      if (queue_) flush_all();  // what was asked for still happens
    } catch (const Error&) {
    }
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
#if !defined(TESSERA_HIP)
    blas_.reset();
#endif
    for (Scratch* s : {&act_, &wexp_, &aux_, &attn_, &acc_, &rope_table_}) {
      if (s->ptr != nullptr) (void)cudaFree(s->ptr);
    }
    if (iq_tables_ != nullptr) (void)cudaFree(const_cast<uint8_t*>(iq_tables_));
    if (status_host_ != nullptr) (void)cudaFreeHost(status_host_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  std::string_view name() const override { return kBackend; }
  std::vector<DeviceInfo> devices() const override {
    std::vector<DeviceInfo> out = enumerate_devices();
#if !defined(TESSERA_HIP)
    // Which GEMM path large batches take is part of what the numbers mean.
    for (DeviceInfo& d : out) {
      if (d.index == device_) d.name += blas_ ? " (" + blas_->name() + ")" : " (own GEMM kernels: " + blas_missing_ + ")";
    }
#endif
    return out;
  }
  bool supports(Op op, DType dtype) const override {
    switch (op) {
      case Op::gemm: return gemm_dtype(dtype);
      case Op::embedding: return gemm_dtype(dtype) && dtype != DType::I8 && dtype != DType::I4;
      case Op::kv_write:
      case Op::attention:
      case Op::sparse_attention: return cache_dtype(dtype);
      default: return dtype == DType::F32;
    }
  }

  // Memory. Host copies return once the data has landed (as on the CPU backend), so the caller may
  // reuse or read its host buffer at once; device-side work stays asynchronous on the stream.
  void* allocate(size_t bytes) override {
    activate();
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(kBackend + " backend: out of device memory allocating " + std::to_string(bytes) +
                  " bytes on device " + std::to_string(device_) + " (" + TESSERA_GPU_API "Malloc: " +
                  cudaGetErrorString(status) + ")");
    }
    return p;
  }
  void deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return;
    (void)cudaSetDevice(device_);
    try {
      flush_all();  // queued ops may still use this memory
    } catch (const Error&) {
      if (!deferred_error_) deferred_error_ = std::current_exception();  // reported at the next copy or sync
    }
    (void)cudaFree(ptr);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    drain_queue();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy_to_device");
    check(cudaStreamSynchronize(stream_), "copy_to_device");
    check_status();
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    drain_queue();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy_to_host");
    check(cudaStreamSynchronize(stream_), "copy_to_host");
    check_status();
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    enqueue("copy_on_device", [=](cudaStream_t s) {
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy_on_device");
    }, dst, src, bytes);
  }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                 int64_t rows) override {
    if (rows <= 0 || row_bytes == 0) return;
    enqueue("copy_rows", [=](cudaStream_t s) {
      check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, size_t(rows), cudaMemcpyDeviceToDevice, s),
            "copy_rows");
    }, dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }
  void fill_zero(void* dst, size_t bytes) override {
    enqueue("fill_zero", [=](cudaStream_t s) { check(cudaMemsetAsync(dst, 0, bytes, s), "fill_zero"); }, dst, bytes);
  }
  void synchronize() override {
    drain_queue();
    check(cudaStreamSynchronize(stream_), "synchronize");
    check_status();
  }

  // Kernels.
  void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) override {
    if (!supports(Op::embedding, table.dtype)) unsupported("embedding", table.dtype);
    const GpuWeight gw = to_gpu(table, "embedding");
    DeviceStatus* status = status_dev_;
    enqueue("embedding", [=](cudaStream_t s) { gpu::embedding(gw, ids, n, out, status, s); }, gw, ids, n, out, status);
  }

  void gemm(const float* x, int64_t m, const WeightView& w, float* y) override {
    if (!gemm_dtype(w.dtype)) unsupported("gemm", w.dtype);
    if (w.kernel_variant != kVariantDefault && w.kernel_variant != kVariantOwnKernels) {
      throw Error(kBackend + " gemm: unknown kernel variant " + std::to_string(w.kernel_variant) +
                  " (0 = default, 1 = own kernels only)");
    }
    if (w.dtype == DType::I8) return gemm_i8(x, m, w, y);
    const GpuWeight gw = to_gpu(w, "gemm");
    if (m <= 0 || w.rows <= 0) return;
#if !defined(TESSERA_HIP)
    if (blas_ && w.kernel_variant == kVariantDefault && m >= kBlasMinRows && blas_gemm(x, m, w, gw, y)) return;
#endif
    enqueue("gemm", [=](cudaStream_t s) { gpu::gemm(x, m, gw, y, s); }, x, m, gw, y);
  }

  void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps) override {
    if (held_add_ && held_add_->out == x && held_add_->n == rows * dim &&
        add_rms_norm_fits(held_add_->a, held_add_->b, x, out, weight, dim)) {
      const HeldAdd h = *held_add_;
      held_add_.reset();
      enqueue("add + rms_norm", [=](cudaStream_t s) { gpu::add_rms_norm(h.a, h.b, h.out, weight, out, rows, dim, eps, s); },
              h.a, h.b, h.out, weight, out, rows, dim, eps);
      return;
    }
    enqueue("rms_norm", [=](cudaStream_t s) { gpu::rms_norm(x, weight, out, rows, dim, eps, s); }, x, weight, out,
            rows, dim, eps);
  }
  void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
            float theta, RopeStyle style) override {
    if (rope_dim > head_dim || rope_dim % 2 != 0) {
      throw Error(kBackend + " rope: rope_dim " + std::to_string(rope_dim) + " must be even and at most head_dim " +
                  std::to_string(head_dim));
    }
    const HeldRope r{x, positions, rows, n_heads, head_dim, rope_dim, theta, style == RopeStyle::neox,
                     rope_table(rope_dim, theta)};
    if (held_rope_ && held_rope_->same_rotation(r) && held_rope_->x != x) {  // a step's keys after its queries
      const HeldRope q = *held_rope_;
      held_rope_.reset();
      enqueue_rope(q, r.x, r.n_heads);
      return;
    }
    release_held();
    held_rope_ = r;
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    enqueue("silu_mul", [=](cudaStream_t s) { gpu::silu_mul(gate, up, out, n, s); }, gate, up, out, n);
  }
  void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
                  int64_t rope_dim, const float* inv_freq, float mscale, RopeStyle style) override {
    if (rope_dim > head_dim || rope_dim % 2 != 0) {
      throw Error(kBackend + " rope_freqs: rope_dim " + std::to_string(rope_dim) +
                  " must be even and at most head_dim " + std::to_string(head_dim));
    }
    const bool neox = style == RopeStyle::neox;
    enqueue("rope_freqs", [=](cudaStream_t s) {
      gpu::rope_freqs(x, positions, rows, n_heads, head_dim, rope_dim, inv_freq, mscale, neox, s);
    }, x, positions, rows, n_heads, head_dim, rope_dim, inv_freq, mscale, neox);
  }
  void gelu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    enqueue("gelu_mul", [=](cudaStream_t s) { gpu::gelu_mul(gate, up, out, n, s); }, gate, up, out, n);
  }
  void add_rows(float* x, const float* row, int64_t rows, int64_t cols) override {
    enqueue("add_rows", [=](cudaStream_t s) { gpu::add_rows(x, row, rows, cols, s); }, x, row, rows, cols);
  }
  void scale(float* x, float s, int64_t n) override {
    enqueue("scale", [=](cudaStream_t st) { gpu::scale(x, s, n, st); }, x, s, n);
  }
  void add(const float* a, const float* b, float* out, int64_t n) override {
    release_held();
    held_add_ = HeldAdd{a, b, out, n};  // launched with the next op, or fused into it if that is its norm
  }
  void softmax(float* x, int64_t rows, int64_t cols) override {
    enqueue("softmax", [=](cudaStream_t s) { gpu::softmax(x, rows, cols, s); }, x, rows, cols);
  }
  void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t rows) override {
    if (!cache_dtype(kv.dtype)) unsupported("kv_write", kv.dtype);
    const KvPools p = pools(kv);
    DeviceStatus* status = status_dev_;
    enqueue("kv_write", [=](cudaStream_t s) { gpu::kv_write(p, k, v, slots, rows, status, s); }, p, k, v, slots, rows,
            status);
  }
  void attention(const AttentionArgs& args, const KvLayerView& kv) override {
    AttnParams a = attention_params(args, kv, "attention");
    a.max_context_len = attention_context_bucket(a.max_context_len);  // decode steps' launches stay equal
    const KvPools p = pools(kv);
    const size_t bytes = attention_scratch_bytes(a, p);
    float* partial = bytes > 0 ? static_cast<float*>(scratch(attn_, bytes)) : nullptr;
    enqueue("attention", [=](cudaStream_t s) { gpu::attention(a, p, partial, s); }, a, p, partial);
  }
  void attention_block_scores(const AttentionArgs& args, const KvLayerView& kv, float* scores) override {
    const AttnParams a = attention_params(args, kv, "attention_block_scores");
    if (a.sparse_block <= 0) return;
    const KvPools p = pools(kv);
    auto* means = static_cast<float*>(scratch(aux_, block_scores_scratch_bytes(a, p)));
    enqueue("attention_block_scores", [=](cudaStream_t s) { gpu::attention_block_scores(a, p, scores, means, s); }, a,
            p, scores, means);
  }
  void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out) override {
    if (cols > INT32_MAX) throw Error(kBackend + " argmax: " + std::to_string(cols) + " columns exceed int32 ids");
    enqueue("argmax", [=](cudaStream_t s) { gpu::argmax(logits, rows, cols, out, s); }, logits, rows, cols, out);
  }

 private:
  // The runtime's current device is per host thread, and the engine may call from any thread.
  void activate() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_) {
      check(cudaSetDevice(device_), TESSERA_GPU_API "SetDevice");
    }
  }
  // Queues a launch; `key` lists every value `launch` uses (LaunchKey).
  template <class F, class... T>
  void enqueue(const char* op, F&& launch, const T&... key) {
    release_held();
    activate();  // the queue may launch a full segment now
    queue_->push(op, std::forward<F>(launch), key...);
  }

  // The last add or rope is held back one call, to be fused with what a decode step calls next
  // (add then the norm of its sum: one pass; the queries' rope then the keys': one launch). Every
  // other path releases it first, so the stream order is the call order.
  struct HeldAdd {
    const float* a;
    const float* b;
    float* out;
    int64_t n;
  };
  struct HeldRope {
    float* x;
    const int32_t* positions;
    int64_t rows, n_heads, head_dim, rope_dim;
    float theta;
    bool neox;
    const float* table;
    bool same_rotation(const HeldRope& o) const {
      return positions == o.positions && rows == o.rows && head_dim == o.head_dim && rope_dim == o.rope_dim &&
             theta == o.theta && neox == o.neox && table == o.table;
    }
  };
  void enqueue_rope(const HeldRope& r, float* x2, int64_t n_heads2) {
    enqueue("rope", [=](cudaStream_t s) {
      gpu::rope(r.x, r.n_heads, x2, n_heads2, r.positions, r.rows, r.head_dim, r.rope_dim, r.theta, r.neox, r.table,
                kRopeTablePositions, s);
    }, r.x, r.n_heads, x2, n_heads2, r.positions, r.rows, r.head_dim, r.rope_dim, r.theta, r.neox, r.table);
  }
  void release_held() {
    if (held_add_) {
      const HeldAdd h = *held_add_;
      held_add_.reset();
      enqueue("add", [=](cudaStream_t s) { gpu::add(h.a, h.b, h.out, h.n, s); }, h.a, h.b, h.out, h.n);
    }
    if (held_rope_) {
      const HeldRope r = *held_rope_;
      held_rope_.reset();
      enqueue_rope(r, nullptr, 0);
    }
  }
  void flush_all() {
    release_held();
    queue_->flush();
  }

  // Launches what is queued, then reports an error a free could not throw.
  void drain_queue() {
    activate();
    flush_all();
    if (deferred_error_) std::rethrow_exception(std::exchange(deferred_error_, nullptr));
  }
  [[noreturn]] static void unsupported(const char* op, DType t) {
    throw Error(kBackend + " " + op + " does not support " + std::string(dtype_name(t)));
  }

  // Reports (once) the first data error a kernel recorded since the last check.
  void check_status() {
    volatile DeviceStatus* s = status_host_;
    const int32_t code = s->code;
    if (code == kStatusOk) return;
    const int64_t value = s->value, limit = s->limit;
    s->code = kStatusOk;
    if (code == kStatusBadToken) {
      throw Error("token id " + std::to_string(value) + " is outside the vocabulary (0.." + std::to_string(limit - 1) +
                  ")");
    }
    throw Error("kv slot " + std::to_string(value) + " is outside the cache (" + std::to_string(limit) + " slots)");
  }

  // The rotations of the first kRopeTablePositions positions for (rope_dim, theta), made on first
  // use; a call with other settings (another model on this backend) replaces it.
  const float* rope_table(int64_t rope_dim, float theta) {
    if (rope_dim != rope_table_dim_ || theta != rope_table_theta_) {
      activate();
      const size_t bytes = size_t(kRopeTablePositions * (rope_dim / 2)) * 2 * sizeof(float);
      float* table = static_cast<float*>(scratch(rope_table_, bytes));
      flush_all();  // queued ropes read the old table
      fill_rope_table(table, kRopeTablePositions, rope_dim, theta, stream_);
      check(cudaGetLastError(), "rope table launch");
      rope_table_dim_ = rope_dim;
      rope_table_theta_ = theta;
    }
    return static_cast<const float*>(rope_table_.ptr);
  }

  void* scratch(Scratch& s, size_t bytes) {
    if (bytes > s.bytes) {
      activate();
      flush_all();                                              // queued ops may use the old buffer
      check(cudaStreamSynchronize(stream_), "scratch resize");  // and earlier kernels still read it
      if (s.ptr != nullptr) check(cudaFree(s.ptr), TESSERA_GPU_API "Free");
      s.ptr = nullptr;
      s.bytes = 0;
      s.ptr = allocate(bytes);
      s.bytes = bytes;
    }
    return s.ptr;
  }

  GpuWeight to_gpu(const WeightView& w, const char* op) const {
    GpuWeight g{w.data, WFormat::f32, w.rows, w.cols, w.scales, w.zeros, w.group_size, iq_tables_};
    switch (w.dtype) {
      case DType::F32: g.format = WFormat::f32; break;
      case DType::F16: g.format = WFormat::f16; break;
      case DType::BF16: g.format = WFormat::bf16; break;
      case DType::Q8_0: g.format = WFormat::q8_0; break;
      case DType::Q4_0: g.format = WFormat::q4_0; break;
      case DType::I4: g.format = WFormat::i4; break;
      case DType::Q4_1: g.format = WFormat::q4_1; break;
      case DType::Q5_0: g.format = WFormat::q5_0; break;
      case DType::Q5_1: g.format = WFormat::q5_1; break;
      case DType::IQ4_NL: g.format = WFormat::iq4_nl; break;
      case DType::Q2_K: g.format = WFormat::q2_k; break;
      case DType::Q3_K: g.format = WFormat::q3_k; break;
      case DType::Q4_K: g.format = WFormat::q4_k; break;
      case DType::Q5_K: g.format = WFormat::q5_k; break;
      case DType::Q6_K: g.format = WFormat::q6_k; break;
      case DType::IQ4_XS: g.format = WFormat::iq4_xs; break;
      case DType::IQ2_XXS: g.format = WFormat::iq2_xxs; break;
      case DType::IQ2_XS: g.format = WFormat::iq2_xs; break;
      case DType::IQ2_S: g.format = WFormat::iq2_s; break;
      case DType::IQ3_XXS: g.format = WFormat::iq3_xxs; break;
      case DType::IQ3_S: g.format = WFormat::iq3_s; break;
      default: unsupported(op, w.dtype);
    }
    (void)dtype_row_bytes(w.dtype, w.cols);  // throws for a row that is not whole blocks
    if (w.dtype == DType::I4) {
      if (g.group_size <= 0) g.group_size = w.cols;  // one group per row, as on the CPU
      if (w.cols % g.group_size != 0) {
        throw Error(kBackend + " gemm on i4: " + std::to_string(w.cols) + " columns are not whole groups of " +
                    std::to_string(g.group_size));
      }
      if (w.scales == nullptr) throw Error(kBackend + " gemm on i4: the weight has no scales");
    }
    return g;
  }

  void gemm_i8(const float* x, int64_t m, const WeightView& w, float* y) {
    if (w.scales == nullptr) throw Error(kBackend + " gemm on i8: the weight has no scales");
    if (m <= 0 || w.rows <= 0) return;  // m = 0 only validates the view
    const int64_t k = w.cols, n = w.rows;
    const size_t q_bytes = (size_t(m * k) + 255) / 256 * 256;
    auto* base = static_cast<uint8_t*>(scratch(act_, q_bytes + size_t(m) * sizeof(float)));
    auto* xq = reinterpret_cast<int8_t*>(base);
    auto* sx = reinterpret_cast<float*>(base + q_bytes);
    const auto* wd = static_cast<const int8_t*>(w.data);
    const float* ws = w.scales;
#if !defined(TESSERA_HIP)
    // Batches and prefill: cuBLAS's int8 tensor-core GEMM into exact int32, then the same rescale.
    if (blas_ && w.kernel_variant == kVariantDefault && m >= kBlasMinRows) {
      auto* acc = static_cast<int32_t*>(scratch(acc_, size_t(m * n) * sizeof(int32_t)));
      VendorBlas* blas = blas_.get();
      enqueue("gemm (i8, cuBLAS)", [=](cudaStream_t s) {
        quantize_rows_i8(x, m, k, xq, sx, s);
        if (blas->gemm_i8(xq, m, wd, n, k, acc)) {
          scale_i32(acc, sx, ws, m, n, y, s);
        } else {
          gpu::gemm_i8(xq, sx, m, wd, ws, n, k, y, s);  // a shape cuBLAS refuses
        }
      }, x, m, k, xq, sx, wd, ws, n, y, acc);
      return;
    }
#endif
    enqueue("gemm (i8)", [=](cudaStream_t s) {
      if (gemv_i8_fused(x, m, wd, ws, n, k, y, s)) return;
      quantize_rows_i8(x, m, k, xq, sx, s);
      gpu::gemm_i8(xq, sx, m, wd, ws, n, k, y, s);
    }, x, m, k, xq, sx, wd, ws, n, y);
  }

#if !defined(TESSERA_HIP)
  // The vendor BLAS path; false when this weight type stays on the own kernels for this m.
  bool blas_gemm(const float* x, int64_t m, const WeightView& w, const GpuWeight& gw, float* y) {
    const int64_t n = w.rows, k = w.cols;
    VendorBlas* blas = blas_.get();
    if (w.dtype == DType::F32) {
      const void* wdata = w.data;
      enqueue("gemm (cuBLAS)", [=](cudaStream_t) { blas->gemm(VendorBlas::Type::f32, x, m, wdata, n, k, y); }, x, m,
              wdata, n, k, y);
      return true;
    }
    const bool half = w.dtype == DType::F16 || w.dtype == DType::BF16;
    if (!half && m < kDequantMinRows) return false;
    const bool bf16 = w.dtype == DType::BF16;
    auto* xh = static_cast<uint16_t*>(scratch(act_, size_t(m * k) * 2));
    uint16_t* wh = half ? nullptr : static_cast<uint16_t*>(scratch(wexp_, size_t(n * k) * 2));
    const void* wdata = half ? w.data : wh;
    enqueue("gemm (cuBLAS)", [=](cudaStream_t s) {
      floats_to_half(x, m * k, xh, bf16, s);
      if (wh != nullptr) dequantize_to_f16(gw, wh, s);
      check(cudaGetLastError(), "gemm (conversion for cuBLAS) launch");
      blas->gemm(bf16 ? VendorBlas::Type::bf16 : VendorBlas::Type::f16, xh, m, wdata, n, k, y);
    }, x, m, gw, y, xh, wh, bf16);
    return true;
  }
#endif

  KvPools pools(const KvLayerView& kv) const {
    return KvPools{kv.k, kv.v, cache_type(kv.dtype), kv.num_blocks, kv.block_size, kv.n_kv_heads, kv.head_dim};
  }

  AttnParams attention_params(const AttentionArgs& a, const KvLayerView& kv, const char* op) const {
    if (!cache_dtype(kv.dtype)) unsupported(op, kv.dtype);
    if (kv.n_kv_heads <= 0 || a.n_heads % kv.n_kv_heads != 0 || kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim ||
        kv.block_size <= 0 || kv.n_kv_heads > 65535) {
      throw Error(kBackend + " " + op + ": unsupported head layout (" + std::to_string(a.n_heads) + " heads, " +
                  std::to_string(kv.n_kv_heads) + " kv heads, head size " + std::to_string(kv.head_dim) +
                  ", block size " + std::to_string(kv.block_size) + "; head size at most " +
                  std::to_string(kMaxHeadDim) + ")");
    }
    const int64_t group = a.n_heads / kv.n_kv_heads;
    if ((int64_t(a.max_q_len) * group + 15) / 16 > 65535 || a.n_seqs > INT32_MAX) {
      throw Error(kBackend + " " + op + ": " + std::to_string(a.max_q_len) + " queries of " + std::to_string(group) +
                  " heads per kv head exceed one launch; split the prefill into smaller chunks");
    }
    AttnParams p{};
    p.q = a.q;
    p.out = a.out;
    p.n_tokens = a.n_tokens;
    p.n_heads = a.n_heads;
    p.scale = a.scale;
    p.softcap = a.softcap;
    p.window = a.window;
    p.seqs = reinterpret_cast<const SeqDesc*>(a.seqs);
    p.n_seqs = a.n_seqs;
    p.block_tables = a.block_tables;
    p.max_q_len = a.max_q_len;
    p.max_context_len = a.max_context_len;
    p.sparse_block = a.sparse.block;
    p.seq_base = a.sparse.seq_base;
    p.offsets = a.sparse.offsets;
    p.kept = a.sparse.kept;
    return p;
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  DeviceStatus* status_host_ = nullptr;
  DeviceStatus* status_dev_ = nullptr;
  const uint8_t* iq_tables_ = nullptr;  // gguf::IqTables in device memory
  Scratch act_;   // quantized or half activations
  Scratch wexp_;  // a weight expanded to f16 for the vendor BLAS
  Scratch aux_;   // block-score key means
  Scratch attn_;  // attention's per-split partial rows
  Scratch acc_;   // int32 products of the vendor BLAS's int8 GEMM
  Scratch rope_table_;
  int64_t rope_table_dim_ = 0;
  float rope_table_theta_ = 0;
#if !defined(TESSERA_HIP)
  std::unique_ptr<VendorBlas> blas_;
  std::string blas_missing_;
#endif
  std::unique_ptr<LaunchQueue> queue_;  // after blas_: destroyed first; the destructor drains it before that
  std::exception_ptr deferred_error_;
  std::optional<HeldAdd> held_add_;
  std::optional<HeldRope> held_rope_;
};

std::unique_ptr<Backend> create_backend(const Params& params) {
  const int64_t device = params.get_int("device");
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    const std::string reason = status != cudaSuccess ? cudaGetErrorString(status) : "0 devices";
    throw Error(kBackend + " backend: no " TESSERA_GPU_VENDOR " device available (" TESSERA_GPU_API
                           "GetDeviceCount: " + reason + ")");
  }
  if (device < 0 || device >= count) {
    throw Error(kBackend + " backend: device " + std::to_string(device) + " requested, but " +
                std::to_string(count) + " " TESSERA_GPU_VENDOR " device(s) are present (0.." +
                std::to_string(count - 1) + ")");
  }
  return std::make_unique<GpuBackend>(static_cast<int>(device), params.get_bool("graphs"));
}

void register_gpu(Registrar& r) {
  r.add<Backend>(kBackend, kDoc,
                 {{"device", ParamType::integer, 0, "device index (0 = the first GPU the runtime reports)", {}},
                  {"graphs", ParamType::boolean, true, kGraphsDoc, {}}},
                 [](const Params& p) { return create_backend(p); });
}

}  // namespace

}  // namespace tessera::gpu

#if defined(TESSERA_HIP)
TESSERA_PLUGIN("kernels_hip", tessera::gpu::register_gpu)
#else
TESSERA_PLUGIN("kernels_cuda", tessera::gpu::register_gpu)
#endif
