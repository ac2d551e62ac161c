// Kernel launchers shared by the CUDA and HIP backends. The kernels build with nvcc/hipcc as C++17;
// the backend class builds with the host C++ compiler against the SDK. Only plain pointers,
// integers and the plain structs below cross between the two (gpu_backend.cpp checks that the
// mirrored SDK structs have the same layout), so the device compiler never meets the SDK headers.
//
// Each launcher enqueues on `stream` and returns without synchronising; the caller checks
// cudaGetLastError() so that a failed launch is reported with the op's name. Shapes are validated
// by the caller (gpu_backend.cpp), which throws tessera::Error naming the problem.
#pragma once

#include <cstddef>
#include <cstdint>

#include "vendor.h"

namespace tessera::gpu {

// Errors found by kernels (data-dependent, so unknown at launch): the first one is recorded in
// host-mapped memory and reported by the backend at the next synchronisation.
struct DeviceStatus {
  int32_t code;  // kStatusOk, or what went wrong
  int32_t pad;
  int64_t value;  // the offending id or slot
  int64_t limit;  // the size it had to be below
};
constexpr int32_t kStatusOk = 0;
constexpr int32_t kStatusBadToken = 1;
constexpr int32_t kStatusBadSlot = 2;

// Weight layouts the GPU kernels read (see tessera/tensor.h and dtype.h for the bytes; the GGUF
// blocks past q4_0 are decoded by kernels/gguf_blocks.cuh).
enum class WFormat : int32_t {
  f32, f16, bf16, q8_0, q4_0, i4,
  q4_1, q5_0, q5_1, iq4_nl,          // blocks of 32
  q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs,  // super-blocks of 256
  iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s  // grid super-blocks of 256 (read iq_tables)
};

struct GpuWeight {
  const void* data;
  WFormat format;
  int64_t rows;  // n: output features
  int64_t cols;  // k
  const float* scales;  // i4: [rows][cols / group_size]
  const float* zeros;   // i4 asymmetric, or null (symmetric: zero point 8)
  int64_t group_size;   // i4 (> 0)
  const uint8_t* iq_tables;  // the grid formats: codebooks and signs laid out as gguf::IqTables
};

// Bytes of one row of `cols` elements.
int64_t weight_row_bytes(WFormat format, int64_t cols);

enum class CacheType : int32_t { f32, f16, bf16 };

// Mirrors tessera::AttentionSeqDesc.
struct SeqDesc {
  int32_t q_start;
  int32_t q_len;
  int32_t context_len;
  int32_t block_table_offset;
};

// Mirrors tessera::KvLayerView.
struct KvPools {
  void* k;
  void* v;
  CacheType type;
  int64_t num_blocks;
  int64_t block_size;
  int64_t n_kv_heads;
  int64_t head_dim;
};

// tessera::AttentionArgs with the sparse layout flattened.
struct AttnParams {
  const float* q;
  float* out;
  int64_t n_tokens;
  int64_t n_heads;
  float scale;
  float softcap;  // 0 = none; else scores become softcap * tanh(score / softcap)
  int64_t window;
  const SeqDesc* seqs;
  int64_t n_seqs;
  const int32_t* block_tables;
  int32_t max_q_len;
  int32_t max_context_len;
  int64_t sparse_block;      // 0 = dense
  const int32_t* seq_base;   // [n_seqs]
  const int32_t* offsets;
  const int32_t* kept;
};

// Largest head size the attention kernels take.
constexpr int64_t kMaxHeadDim = 256;

// out[i] = a[i] + b[i]
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// out[i] = gelu_tanh(gate[i]) * up[i]
void gelu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// x[r][c] += row[c]
void add_rows(float* x, const float* row, int64_t rows, int64_t cols, cudaStream_t stream);
// x[i] *= s
void scale(float* x, float s, int64_t n, cudaStream_t stream);
// RoPE by per-pair inverse frequencies (device memory), cos and sin times mscale (Backend::rope_freqs).
void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                const float* inv_freq, float mscale, bool neox, cudaStream_t stream);
// out[r] = x[r] / rms(x[r]) * weight; out may equal x.
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
              cudaStream_t stream);
// sum = a + b, then out[r] = sum[r] / rms(sum[r]) * weight, in one pass (a residual add and the
// next norm); sum may equal a, out may equal b. Only where add_rms_norm_fits(sum, out, weight, dim).
bool add_rms_norm_fits(const void* a, const void* b, const void* sum, const void* out, const void* weight,
                       int64_t dim);
void add_rms_norm(const float* a, const float* b, float* sum, const float* weight, float* out, int64_t rows,
                  int64_t dim, float eps, cudaStream_t stream);
// Rotates x ([rows][n_heads][head_dim]) and, when x2 is not null, x2 ([rows][n_heads2][head_dim],
// the same positions: a step's queries and keys in one launch). Rotations of the first
// `table_positions` positions come from `table` (made by fill_rope_table with the same rope_dim and
// theta: cos and sin of pair i at position p at [2 * (p * rope_dim / 2 + i)]); later positions, or
// all when table is null, are computed in the kernel.
void rope(float* x, int64_t n_heads, float* x2, int64_t n_heads2, const int32_t* positions, int64_t rows,
          int64_t head_dim, int64_t rope_dim, float theta, bool neox, const float* table, int64_t table_positions,
          cudaStream_t stream);
void fill_rope_table(float* table, int64_t positions, int64_t rope_dim, float theta, cudaStream_t stream);
void softmax(float* x, int64_t rows, int64_t cols, cudaStream_t stream);
void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream);
// Rows of a table of any WFormat but i4; an id outside [0, rows) is recorded in status.
void embedding(const GpuWeight& table, const int32_t* ids, int64_t n, float* out, DeviceStatus* status,
               cudaStream_t stream);

// y[m][n] = x[m][k] · W[n][k]ᵀ with the weight unpacked in registers (any WFormat): a warp per
// output feature for small m (decode), shared-memory tiles otherwise.
void gemm(const float* x, int64_t m, const GpuWeight& w, float* y, cudaStream_t stream);
// W8A8: x rows quantized to int8 with scale absmax/127 (round to nearest even), then int32 dot
// products rescaled by both scales: y = float(acc) * (sx * w_scale).
void quantize_rows_i8(const float* x, int64_t m, int64_t k, int8_t* xq, float* sx, cudaStream_t stream);
void gemm_i8(const int8_t* xq, const float* sx, int64_t m, const int8_t* w, const float* w_scales, int64_t n,
             int64_t k, float* y, cudaStream_t stream);
// W8A8 for m <= 8 (decode) in one launch, the activations quantized by each block as
// quantize_rows_i8 would (same bits as the two calls); false, launching nothing, for shapes it
// does not take (k not a multiple of 16, m * k past 40 KiB, unaligned rows).
bool gemv_i8_fused(const float* x, int64_t m, const int8_t* w, const float* w_scales, int64_t n, int64_t k, float* y,
                   cudaStream_t stream);
// The dequantization of an exact int32 product made elsewhere (vendor BLAS): the same one gemm_i8 fuses.
void scale_i32(const int32_t* acc, const float* sx, const float* w_scales, int64_t m, int64_t n, float* y,
               cudaStream_t stream);
// For vendor BLAS: activations to f16/bf16 bits, and a whole weight to f16 bits.
void floats_to_half(const float* x, int64_t n, uint16_t* out, bool bf16, cudaStream_t stream);
void dequantize_to_f16(const GpuWeight& w, uint16_t* out, cudaStream_t stream);

// Stores k/v rows at their slots; a slot outside the pool is recorded in status.
void kv_write(const KvPools& kv, const float* k, const float* v, const int32_t* slots, int64_t rows,
              DeviceStatus* status, cudaStream_t stream);
// Paged causal attention (ragged batch, GQA, sliding window, block-sparse layout). `scratch` holds
// attention_scratch_bytes(a, kv) bytes (may be null when that is 0).
void attention(const AttnParams& a, const KvPools& kv, float* scratch, cudaStream_t stream);
size_t attention_scratch_bytes(const AttnParams& a, const KvPools& kv);
// attention() reads max_context_len only to pick how many blocks share a row's keys; this rounds it
// up to the next value that changes that choice, so successive decode steps launch alike.
int32_t attention_context_bucket(int32_t max_context_len);
// The tiled kernel attention() uses for dense layouts up to head size 128 (attention_dense_gpu.cu).
bool dense_attention_applies(const AttnParams& a, const KvPools& kv);
size_t dense_attention_scratch_bytes(const AttnParams& a, const KvPools& kv);
void dense_attention(const AttnParams& a, const KvPools& kv, float* scratch, cudaStream_t stream);
// Scratch the block scores need (key-block means), in bytes.
size_t block_scores_scratch_bytes(const AttnParams& a, const KvPools& kv);
void attention_block_scores(const AttnParams& a, const KvPools& kv, float* scores, float* scratch,
                            cudaStream_t stream);

}  // namespace tessera::gpu
