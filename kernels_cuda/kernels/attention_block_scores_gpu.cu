// Key-block scores for block-sparse prefill (see Backend::attention_block_scores): the mean query of
// each query block (over its queries in this step and the kv head's query group) against the mean
// key of every causal key block, scaled. Two launches: key-block means into scratch
// ([seq][kv head][key block][head_dim]), then one block per (sequence, kv head, query block) that
// averages its queries in shared memory and scores them against each key block with a warp per
// block. Sums run in the CPU reference's order, so only the final dot products round differently.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;

__device__ inline int64_t n_kb_stride(const AttnParams& a) {
  return (int64_t(a.max_context_len) + a.sparse_block - 1) / a.sparse_block;
}

template <class T>
__global__ void key_means_kernel(AttnParams a, KvPools kv, float* __restrict__ kmean) {
  const int64_t seq = blockIdx.z, h = blockIdx.y, kb = blockIdx.x;
  if (a.seq_base[seq] < 0) return;
  const SeqDesc s = a.seqs[seq];
  const int64_t block = a.sparse_block, hd = kv.head_dim;
  if (kb > (int64_t(s.context_len) - 1) / block) return;
  const int32_t* table = a.block_tables + s.block_table_offset;
  const int64_t end = min(int64_t(s.context_len), (kb + 1) * block);
  const float inv = 1.0f / float(end - kb * block);
  float* out = kmean + ((seq * kv.n_kv_heads + h) * n_kb_stride(a) + kb) * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t key = kb * block; key < end; ++key) {
      const int64_t slot = int64_t(table[key / kv.block_size]) * kv.block_size + key % kv.block_size;
      sum += CacheElem<T>::load(static_cast<const T*>(kv.k), slot * kv.n_kv_heads * hd + h * hd + d);
    }
    out[d] = sum * inv;
  }
}

__global__ void block_scores_kernel(AttnParams a, KvPools kv, const float* __restrict__ kmean,
                                    float* __restrict__ scores) {
  extern __shared__ float qmean[];  // [hd]
  const int64_t seq = blockIdx.z, h = blockIdx.y, qb = blockIdx.x;
  if (a.seq_base[seq] < 0) return;
  const SeqDesc s = a.seqs[seq];
  const int64_t block = a.sparse_block, hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t first_pos = int64_t(s.context_len) - s.q_len;
  const int64_t first_qb = first_pos / block;
  const int64_t n_qb = (int64_t(s.context_len) - 1) / block - first_qb + 1;
  if (qb >= n_qb) return;
  const int64_t lo = max(first_pos, (first_qb + qb) * block);
  const int64_t hi = min(int64_t(s.context_len), (first_qb + qb + 1) * block);
  const int64_t q_stride = a.n_heads * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t pos = lo; pos < hi; ++pos) {
      const float* row = a.q + (s.q_start + pos - first_pos) * q_stride + h * group * hd;
      for (int64_t g = 0; g < group; ++g) sum += row[g * hd + d];
    }
    qmean[d] = sum;
  }
  __syncthreads();
  const float inv = a.scale / float((hi - lo) * group);
  const int64_t stride = n_kb_stride(a);
  const float* km = kmean + (seq * kv.n_kv_heads + h) * stride * hd;
  float* out = scores + (a.seq_base[seq] + h * n_qb + qb) * stride;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  for (int64_t kb = warp; kb <= first_qb + qb; kb += warps) {
    float dot = 0.0f;
    for (int64_t d = lane; d < hd; d += kWarpSize) dot += qmean[d] * km[kb * hd + d];
    dot = warp_sum(dot);
    if (lane == 0) out[kb] = inv * dot;
  }
}

template <class T>
void launch(const AttnParams& a, const KvPools& kv, float* scores, float* scratch, cudaStream_t stream) {
  const int64_t n_kb = (int64_t(a.max_context_len) + a.sparse_block - 1) / a.sparse_block;
  // A step of q_len queries spans at most (q_len - 1) / block + 2 query blocks.
  const int64_t max_qb = (int64_t(a.max_q_len) - 1) / a.sparse_block + 2;
  const unsigned seqs = static_cast<unsigned>(a.n_seqs), heads = static_cast<unsigned>(kv.n_kv_heads);
  key_means_kernel<T><<<dim3(static_cast<unsigned>(n_kb), heads, seqs), kThreads, 0, stream>>>(a, kv, scratch);
  block_scores_kernel<<<dim3(static_cast<unsigned>(max_qb), heads, seqs), kThreads,
                        size_t(kv.head_dim) * sizeof(float), stream>>>(a, kv, scratch, scores);
}

}  // namespace

size_t block_scores_scratch_bytes(const AttnParams& a, const KvPools& kv) {
  if (a.sparse_block <= 0) return 0;
  const int64_t n_kb = (int64_t(a.max_context_len) + a.sparse_block - 1) / a.sparse_block;
  return size_t(a.n_seqs * kv.n_kv_heads * n_kb * kv.head_dim) * sizeof(float);
}

void attention_block_scores(const AttnParams& a, const KvPools& kv, float* scores, float* scratch,
                            cudaStream_t stream) {
  if (a.sparse_block <= 0 || a.n_seqs <= 0 || a.max_q_len <= 0 || a.max_context_len <= 0) return;
  switch (kv.type) {
    case CacheType::f32: return launch<float>(a, kv, scores, scratch, stream);
    case CacheType::f16: return launch<Half>(a, kv, scores, scratch, stream);
    case CacheType::bf16: return launch<BHalf>(a, kv, scores, scratch, stream);
  }
}

}  // namespace tessera::gpu
