// Paged causal attention for a ragged batch, flash-style: keys are visited in chunks staged in shared
// memory with an online softmax, so no score matrix is materialised. This kernel serves the
// block-sparse layout and head sizes past 128; dense attention up to head size 128 goes to the
// tiled kernel of attention_dense_gpu.cu.
//
// A block serves one (sequence, kv head) and up to kRows (query, head-of-the-group) rows: a decode
// step's whole query group shares every K/V chunk it loads, so each KV head is read once per query
// group; a prefill chunk is tiled into blocks of kRows rows. Within a block each warp owns a few rows:
// a lane scores one key per step (K rows padded by one float, so the lanes hit distinct banks) and
// owns head_dim / warp-size output dimensions for the value sum.
//
// Masks: causal (key <= the row's position), the sliding window (dense only), and the block-sparse
// layout (a key counts only when its block is in the row's kept list; chunks no row of the block
// keeps are skipped before loading). Keys past a sequence's context are never read, so stale or
// poisoned cache slots cannot leak into any output.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kRows = 16;            // rows of a block
constexpr int kRowsPerWarp = 4;      // kRows over the fewest warps a block can have (256 / 64)
constexpr int kDimSlots = kMaxHeadDim / 32;  // output dims per lane with 32-lane warps
constexpr int kMaxChunk = 64;        // keys per chunk; at most two per lane
constexpr size_t kSmemLimit = 48 * 1024;

size_t smem_bytes(int64_t hd, int64_t chunk) {
  return size_t(kRows * hd + chunk * (hd + 1) + chunk * hd) * sizeof(float);
}

struct RowMask {
  int64_t pos = -1;     // the row's position; -1 for an unused row
  int64_t lo = 0;       // first key (sliding window)
  int32_t kept_begin = 0, kept_end = 0;  // sparse: the row's kept key blocks
};

__device__ inline bool key_allowed(const AttnParams& a, bool sparse, const RowMask& r, int64_t key) {
  if (key > r.pos || key < r.lo) return false;
  if (!sparse) return true;
  const int32_t kb = int32_t(key / a.sparse_block);
  int32_t lo = r.kept_begin, hi = r.kept_end;  // kept is ascending: binary search
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (a.kept[mid] < kb) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < r.kept_end && a.kept[lo] == kb;
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnParams a, KvPools kv, int chunk) {
  extern __shared__ float smem[];
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const SeqDesc s = a.seqs[seq];
  const int64_t rows_total = int64_t(s.q_len) * group;
  const int64_t f0 = int64_t(blockIdx.z) * kRows;
  if (f0 >= rows_total) return;  // the whole block: this sequence has fewer rows
  const int nrows = int(min(int64_t(kRows), rows_total - f0));
  const int64_t first_pos = int64_t(s.context_len) - s.q_len;
  const int32_t* table = a.block_tables + s.block_table_offset;
  const int64_t q_stride = a.n_heads * hd, kv_stride = kv.n_kv_heads * hd;
  const bool sparse = a.sparse_block > 0 && a.seq_base[seq] >= 0;

  float* q_s = smem;                   // [kRows][hd]
  float* k_s = q_s + kRows * hd;       // [chunk][hd + 1]
  float* v_s = k_s + chunk * (hd + 1); // [chunk][hd]

  for (int64_t e = threadIdx.x; e < nrows * hd; e += blockDim.x) {
    const int64_t f = f0 + e / hd, d = e % hd;
    q_s[e] = a.q[(s.q_start + f / group) * q_stride + (h * group + f % group) * hd + d];
  }

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  RowMask mask[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimSlots];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < kDimSlots; ++t) acc[i][t] = 0.0f;
    const int r = warp + warps * i;
    if (r >= nrows) continue;
    RowMask& rm = mask[i];
    rm.pos = first_pos + (f0 + r) / group;
    if (sparse) {
      const int64_t first_qb = first_pos / a.sparse_block;
      const int64_t n_qb = (int64_t(s.context_len) - 1) / a.sparse_block - first_qb + 1;
      const int64_t entry = a.seq_base[seq] + h * n_qb + (rm.pos / a.sparse_block - first_qb);
      rm.kept_begin = a.offsets[entry];
      rm.kept_end = a.offsets[entry + 1];
    } else if (a.window > 0) {
      rm.lo = max(int64_t(0), rm.pos - a.window + 1);
    }
  }

  // Keys the block may need: from the first row's window start to the last row's position.
  const int64_t first_row_pos = first_pos + f0 / group;
  const int64_t key_hi = first_pos + (f0 + nrows - 1) / group;
  const int64_t key_lo = (!sparse && a.window > 0) ? max(int64_t(0), first_row_pos - a.window + 1) : 0;
  const float scale = a.scale;

  for (int64_t c0 = key_lo; c0 <= key_hi; c0 += chunk) {
    const int n_c = int(min(int64_t(chunk), key_hi + 1 - c0));
    if (sparse) {
      int any = 0;
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        if (warp + warps * i >= nrows) continue;
        for (int j = lane; j < n_c; j += kWarpSize) any |= key_allowed(a, true, mask[i], c0 + j) ? 1 : 0;
      }
      if (!__syncthreads_or(any)) continue;
    }
    for (int64_t e = threadIdx.x; e < n_c * hd; e += blockDim.x) {
      const int64_t j = e / hd, d = e % hd;
      const int64_t key = c0 + j;
      const int64_t slot = int64_t(table[key / kv.block_size]) * kv.block_size + key % kv.block_size;
      const int64_t idx = slot * kv_stride + h * hd + d;
      k_s[j * (hd + 1) + d] = CacheElem<T>::load(static_cast<const T*>(kv.k), idx);
      v_s[j * hd + d] = CacheElem<T>::load(static_cast<const T*>(kv.v), idx);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + warps * i;
      if (r >= nrows) continue;  // warp-uniform
      const float* qr = q_s + r * hd;
      float sc[kMaxChunk / 32];
      float cmax = -INFINITY;
#pragma unroll
      for (int t = 0; t < kMaxChunk / 32; ++t) {
        const int j = lane + kWarpSize * t;
        sc[t] = -INFINITY;
        if (j < n_c && key_allowed(a, sparse, mask[i], c0 + j)) {
          const float* kr = k_s + j * (hd + 1);
          float dot = 0.0f;
          for (int64_t d = 0; d < hd; ++d) dot += qr[d] * kr[d];
          sc[t] = dot * scale;
          if (a.softcap > 0) sc[t] = a.softcap * tanhf(sc[t] / a.softcap);  // Gemma 2's soft cap
        }
        cmax = fmaxf(cmax, sc[t]);
      }
      cmax = warp_max(cmax);
      if (cmax == -INFINITY) continue;  // no key of this chunk for this row (warp-uniform)
      const float new_m = fmaxf(m[i], cmax);
      const float corr = expf(m[i] - new_m);  // 0 on the row's first keys (m = -inf)
      float psum = 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxChunk / 32; ++t) {
        sc[t] = sc[t] == -INFINITY ? 0.0f : expf(sc[t] - new_m);
        psum += sc[t];
      }
      l[i] = l[i] * corr + warp_sum(psum);
      m[i] = new_m;
#pragma unroll
      for (int t = 0; t < kDimSlots; ++t) acc[i][t] *= corr;
      for (int j = 0; j < n_c; ++j) {
        // The probability of key j lives in lane j % warp size, slot j / warp size.
        const float pj = j < kWarpSize ? shfl(sc[0], j) : shfl(sc[1], j - kWarpSize);
        const float* vr = v_s + j * hd;
#pragma unroll
        for (int t = 0; t < kDimSlots; ++t) {
          const int64_t d = lane + kWarpSize * t;
          if (d < hd) acc[i][t] += pj * vr[d];
        }
      }
    }
    __syncthreads();  // the next chunk overwrites k_s / v_s
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + warps * i;
    if (r >= nrows) continue;
    const int64_t f = f0 + r;
    float* out = a.out + (s.q_start + f / group) * q_stride + (h * group + f % group) * hd;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int t = 0; t < kDimSlots; ++t) {
      const int64_t d = lane + kWarpSize * t;
      if (d < hd) out[d] = acc[i][t] * inv;
    }
  }
}

template <class T>
void launch(const AttnParams& a, const KvPools& kv, cudaStream_t stream) {
  const int64_t group = a.n_heads / kv.n_kv_heads;
  int chunk = kMaxChunk;
  while (chunk > 8 && smem_bytes(kv.head_dim, chunk) > kSmemLimit) chunk /= 2;
  const int64_t tiles = (int64_t(a.max_q_len) * group + kRows - 1) / kRows;
  const dim3 grid(static_cast<unsigned>(a.n_seqs), static_cast<unsigned>(kv.n_kv_heads), static_cast<unsigned>(tiles));
  attention_kernel<T><<<grid, kThreads, smem_bytes(kv.head_dim, chunk), stream>>>(a, kv, chunk);
}

}  // namespace

size_t attention_scratch_bytes(const AttnParams& a, const KvPools& kv) { return dense_attention_scratch_bytes(a, kv); }

void attention(const AttnParams& a, const KvPools& kv, float* scratch, cudaStream_t stream) {
  if (a.n_seqs <= 0 || a.max_q_len <= 0) return;
  if (dense_attention_applies(a, kv)) return dense_attention(a, kv, scratch, stream);
  switch (kv.type) {
    case CacheType::f32: return launch<float>(a, kv, stream);
    case CacheType::f16: return launch<Half>(a, kv, stream);
    case CacheType::bf16: return launch<BHalf>(a, kv, stream);
  }
}

}  // namespace tessera::gpu
