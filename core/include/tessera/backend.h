// A Backend is a device: memory (allocation, copies, synchronisation) plus the kernel interface,
// the fixed set of ops that the model and plugins compose. kernels_cpu implements every op and is
// the reference; other backends answer supports() honestly so that a pipeline is refused at
// validation, by op name, rather than failing mid-run.
//
// Pointers passed to ops are backend memory (from allocate()). Per-step index arrays (token ids,
// positions, KV slots, attention descriptors, block tables) are uploaded once per step by the
// caller, so every layer reads them without further copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/kv_layout.h"
#include "tessera/tensor.h"

namespace tessera {

enum class Op : uint32_t {
  embedding,  // dtype: the table's
  gemm,       // dtype: the weight's (f32, f16, bf16, q8_0, q4_0, ...)
  rms_norm,
  rope,
  silu_mul,
  add,
  softmax,
  kv_write,   // dtype: the cache's
  attention,  // dtype: the cache's
  argmax,
  // Block-sparse prefill (dtype: the cache's): attention() honouring AttentionArgs::sparse, and
  // attention_block_scores() which scores key blocks for it.
  sparse_attention,
  // What architectures beyond llama use (arch/): GeGLU, biases, embedding scale, scaled RoPE.
  gelu_mul,
  add_rows,
  scale,
  rope_freqs,
};
std::string_view op_name(Op op);

// One requirement a component places on the backend, e.g. {gemm, q8_0}.
struct OpRequirement {
  Op op;
  DType dtype = DType::F32;
  std::string who;  // the component that needs it, for the refusal message
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t memory_bytes = 0;
};

enum class RopeStyle : uint8_t {
  adjacent,  // pairs (x[2i], x[2i+1]) — GGUF "llama" models
  neox,      // pairs (x[i], x[i + rope_dim/2])
};

// One sequence of a ragged attention batch. Its queries are rows [q_start, q_start + q_len) and sit
// at positions context_len - q_len ... context_len - 1; its KV (including this step's tokens, already
// written) is at block_tables[block_table_offset ...].
struct AttentionSeqDesc {
  int32_t q_start = 0;
  int32_t q_len = 0;
  int32_t context_len = 0;
  int32_t block_table_offset = 0;
};

// Block-sparse layout for attention(): queries and keys are grouped in blocks of `block` positions
// (block b holds positions [b*block, (b+1)*block)). seq_base[s] < 0 leaves sequence s dense;
// otherwise entry i = seq_base[s] + h * n_qb(s) + qb, for kv head h and query block qb counted from
// the block of the sequence's first query (n_qb(s) blocks cover its queries), lists the key blocks
// its queries attend to: kept[offsets[i] .. offsets[i + 1]), ascending. Causality still applies
// inside each kept block. All arrays are backend memory.
struct BlockSparseLayout {
  int64_t block = 0;  // 0 = dense attention for every sequence
  const int32_t* seq_base = nullptr;  // [n_seqs]
  const int32_t* offsets = nullptr;
  const int32_t* kept = nullptr;
};

struct AttentionArgs {
  const float* q = nullptr;  // [n_tokens][n_heads * head_dim]
  float* out = nullptr;      // [n_tokens][n_heads * head_dim]
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  float scale = 1.0f;
  // Soft-capping of the scaled scores, softcap * tanh(score / softcap), before the softmax (Gemma 2);
  // 0 = none.
  float softcap = 0.0f;
  int64_t window = 0;  // sliding window in tokens; 0 = full causal
  const AttentionSeqDesc* seqs = nullptr;  // backend memory, n_seqs entries
  int64_t n_seqs = 0;
  const int32_t* block_tables = nullptr;   // backend memory
  int32_t max_q_len = 0;                   // host-side bounds, for launch sizing
  int32_t max_context_len = 0;
  BlockSparseLayout sparse;  // only with supports(sparse_attention); the window is ignored where used
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;  // "cpu", "cuda", "hip"
  virtual std::vector<DeviceInfo> devices() const = 0;
  virtual bool supports(Op op, DType dtype) const = 0;
  // Threads used by host-side kernels (CPU backend); other backends may ignore it.
  virtual void set_threads(int threads) { (void)threads; }

  // Memory.
  virtual void* allocate(size_t bytes) = 0;  // throws tessera::Error when out of memory
  virtual void deallocate(void* ptr) noexcept = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  // `rows` rows of `row_bytes` from src (rows `src_pitch` bytes apart) to dst (`dst_pitch` apart),
  // both device memory; the model splits a fused GEMM's output (q|k|v of each token) with it. The
  // default copies row by row; a GPU backend does it in one call.
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                         int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      copy_on_device(static_cast<char*>(dst) + size_t(r) * dst_pitch,
                     static_cast<const char*>(src) + size_t(r) * src_pitch, row_bytes);
    }
  }
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // Kernels.
  // out[i] = table[ids[i]] as float, for n ids; table is [vocab][dim].
  virtual void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) = 0;
  // y[m][n] = x[m][k] · W[n][k]ᵀ
  virtual void gemm(const float* x, int64_t m, const WeightView& w, float* y) = 0;
  // gemm with y's columns dealt out to parts[0, n_parts) in order (their cols sum to w.rows), so
  // that a fused weight's parts need no copy apart. False, with nothing written, where the backend
  // has no such kernel for this weight and m; the caller then runs gemm and splits y itself.
  // (Pointer and count, not std::span: kernel sources that include this header are C++17.)
  virtual bool gemm_parts(const float* x, int64_t m, const WeightView& w, const OutputPart* parts, size_t n_parts) {
    (void)x, (void)m, (void)w, (void)parts, (void)n_parts;
    return false;
  }
  // One token (m = 1) through several weights that share x, in one parallel region where gemm calls
  // fork one each (a layer's q|k and v when v is stored in another format): ys[i] = x · views[i]ᵀ,
  // each output the bits its own gemm gives. False, with nothing written, where the backend has no
  // such path for these weights; the caller then runs gemm on each.
  virtual bool gemv_many(const float* x, const WeightView* views, float* const* ys, size_t n) {
    (void)x, (void)views, (void)ys, (void)n;
    return false;
  }
  // A decode step's layer in one parallel region (thread_team.h) instead of a region per op, for
  // host backends whose ops run on the calling thread alone inside a region: gemv_share is thread
  // t of nt's share of gemv_many(x, views, ys, n) (each weight's rows dealt out, the bits of its
  // gemm), computed on the calling thread; the caller puts a barrier before anything reads a ys
  // whole. Only for weights gemv_shares() takes together: formats it cuts into rows, enough bytes
  // to be worth the threads. The default takes none.
  virtual bool gemv_shares(const WeightView* views, size_t n) const {
    (void)views, (void)n;
    return false;
  }
  virtual void gemv_share(const float* x, const WeightView* views, float* const* ys, size_t n, int t, int nt) {
    (void)x, (void)views, (void)ys, (void)n, (void)t, (void)nt;
  }
  // Called once for each weight a Linear owns, after it was written to the device row-major: the
  // backend may rearrange the bytes in place (same size) into the layout its gemm streams fastest
  // and mark `w` (kernel_variant bits it owns) so that gemm knows. Only gemm ever sees such a view;
  // embedding tables are never prepared. The default leaves the weight as it is.
  virtual void prepare_weight(WeightView& w) { (void)w; }
  virtual void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                        float eps) = 0;
  // In place on x[rows][n_heads * head_dim]; row r rotates by positions[r].
  virtual void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads,
                    int64_t head_dim, int64_t rope_dim, float theta, RopeStyle style) = 0;
  // out = silu(gate) * up, elementwise over n values.
  // RoPE whose pair i turns by position * inv_freq[i] (rope_dim / 2 floats, backend memory), cos and
  // sin multiplied by mscale: RoPE scaling (linear, YaRN) and per-pair factors (rope_freqs.weight)
  // computed once by the model.
  virtual void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
                          int64_t rope_dim, const float* inv_freq, float mscale, RopeStyle style) = 0;
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out = gelu(gate) * up, GELU by its tanh approximation (GeGLU, Gemma).
  virtual void gelu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // x[r][c] += row[c] for rows x cols (a bias added to every token).
  virtual void add_rows(float* x, const float* row, int64_t rows, int64_t cols) = 0;
  // x[i] *= s.
  virtual void scale(float* x, float s, int64_t n) = 0;
  virtual void add(const float* a, const float* b, float* out, int64_t n) = 0;
  virtual void softmax(float* x, int64_t rows, int64_t cols) = 0;
  // Stores k and v rows ([rows][n_kv_heads * head_dim]) at the given slots
  // (slot = block * block_size + offset).
  virtual void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots,
                        int64_t rows) = 0;
  virtual void attention(const AttentionArgs& args, const KvLayerView& kv) = 0;
  // Cheap key-block scores for choosing a sparse layout: for each entry i of args.sparse (seq_base,
  // kv head, query block as in BlockSparseLayout; offsets and kept are not read),
  // scores[i * n_kb + kb] = scale * (mean query of the block over its queries in this step and the
  // head's query group) · (mean key of key block kb), for every key block kb up to the query
  // block's own; n_kb = ceil(max_context_len / block). Other entries are left untouched.
  virtual void attention_block_scores(const AttentionArgs& args, const KvLayerView& kv, float* scores) = 0;
  // out[r] = argmax of logits row r (first maximum on ties).
  virtual void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out) = 0;
};

}  // namespace tessera
