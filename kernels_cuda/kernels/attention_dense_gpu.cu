// Dense paged attention (no block-sparse layout, head size a multiple of 4 up to 128), flash-style
// in tiles: a block takes R rows (query x head-of-the-group pairs of one kv head, as in
// attention_gpu.cu) against chunks of kKeys keys, all through shared memory, each thread owning a
// few rows x keys of the score tile and the same rows x a few dimensions of the output. Prefill tiles
// get 64 rows, so each K/V chunk loaded serves 64 rows; decode gets 16 (one query group).
//
// Split keys: when a launch has too few blocks to fill the GPU (decode: one block per sequence and
// kv head), each (sequence, kv head, tile) is split over several blocks by key chunks; each writes
// its rows' running max, sum and unnormalised output to scratch, and a second kernel merges them.
// The split count depends only on the launch shape and the context bucket (256 keys), so a decode
// step keeps the same launch arguments for 256 tokens (CUDA graph replays stay valid).
#include <algorithm>

#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kThreads = 256;  // 16 x 16: ty picks rows, tx picks keys and dimensions
constexpr int kKeys = 32;      // keys per chunk: two per tx
constexpr int kMaxSplits = 16;
constexpr int64_t kSplitKeys = 256;  // one more split per this many keys of context
constexpr int kTargetBlocks = 264;   // about two blocks per SM of an H100/H200

template <int kRowReps, int kDimReps>
struct Tile {
  static constexpr int R = 16 * kRowReps;   // rows; thread ty owns rows kRowReps * ty ...
  static constexpr int HD = 16 * kDimReps;  // largest head size
  static constexpr int kVecs = HD / 64;     // float4s of output dimensions per thread
  static constexpr int QP = HD + 4;         // row pitch of q and k: 16-byte rows, no bank conflicts
  static constexpr int PP = R + 4;          // row pitch of the probabilities
  static constexpr int kQ = R * QP;         // q: [R][QP]
  static constexpr int kK = kKeys * QP;     // k: [kKeys][QP]
  static constexpr int kV = kKeys * HD;     // v: [kKeys][HD]
  static constexpr int kP = kKeys * PP;     // probabilities, transposed: [kKeys][PP]
  static constexpr size_t kSmem = size_t(kQ + kK + kV + kP) * sizeof(float);
};

__device__ inline float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// One row tile (this split's share of its keys); every thread of the block calls it. Shared memory
// is read in float4s: a thread's rows are consecutive, and so are its output dimensions.
template <class T, int kRowReps, int kDimReps>
__device__ void attend_tile(const AttnParams& a, const KvPools& kv, int tile, int tiles, int split, int splits,
                            float* __restrict__ partial, float* smem, int64_t* key_base) {
  using TL = Tile<kRowReps, kDimReps>;
  constexpr int R = TL::R, HD = TL::HD, QP = TL::QP, PP = TL::PP, kVecs = TL::kVecs;
  float* qs = smem;
  float* ks = qs + TL::kQ;
  float* vs = ks + TL::kK;
  float* ps = vs + TL::kV;

  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const SeqDesc s = a.seqs[seq];
  const int64_t rows_total = int64_t(s.q_len) * group;
  const int64_t f0 = int64_t(tile) * R;
  if (f0 >= rows_total) return;  // the whole block: this sequence has fewer rows
  const int nrows = int(min(int64_t(R), rows_total - f0));
  const int64_t first_pos = int64_t(s.context_len) - s.q_len;
  __syncthreads();  // a previous tile's last reads of the q tile are done
  const int32_t* table = a.block_tables + s.block_table_offset;
  const int64_t q_stride = a.n_heads * hd, kv_stride = kv.n_kv_heads * hd;
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;

  for (int e = t; e < R * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    float v = 0.0f;
    if (r < nrows && d < hd) {
      const int64_t f = f0 + r;
      v = a.q[(s.q_start + f / group) * q_stride + (h * group + f % group) * hd + d];
    }
    qs[r * QP + d] = v;
  }

  // This thread's rows: kRowReps * ty + q.
  int32_t pos[kRowReps], lo[kRowReps];  // positions fit int32 (AttentionSeqDesc holds them so)
  float m[kRowReps], l[kRowReps], o[kRowReps][4 * kVecs];
#pragma unroll
  for (int q = 0; q < kRowReps; ++q) {
    const int r = kRowReps * ty + q;
    pos[q] = r < nrows ? int32_t(first_pos + (f0 + r) / group) : -1;  // -1: no key is allowed
    lo[q] = a.window > 0 ? int32_t(max(int64_t(0), int64_t(pos[q]) - a.window + 1)) : 0;
    m[q] = -INFINITY;
    l[q] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4 * kVecs; ++c) o[q][c] = 0.0f;
  }

  // The block's keys: from the first row's window start to the last row's position, in chunks;
  // this split takes an even share of the chunks.
  const int64_t key_hi = first_pos + (f0 + nrows - 1) / group;
  const int64_t key_lo = a.window > 0 ? max(int64_t(0), first_pos + f0 / group - a.window + 1) : 0;
  const int64_t chunks = (key_hi - key_lo + kKeys) / kKeys;
  const int64_t per_split = (chunks + splits - 1) / splits;
  const int64_t c_begin = int64_t(split) * per_split, c_end = min(chunks, c_begin + per_split);
  const float scale = a.scale;

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int64_t c0 = key_lo + c * kKeys;
    const int n_c = int(min(int64_t(kKeys), key_hi + 1 - c0));
    __syncthreads();  // the previous chunk's reads of ks / vs / ps / key_base (and the q tile's writes) are done
    if (t < n_c) {  // each key's cache row, looked up once (64-bit division is slow on GPUs)
      const int64_t key = c0 + t;
      key_base[t] = (int64_t(table[key / kv.block_size]) * kv.block_size + key % kv.block_size) * kv_stride + h * hd;
    }
    __syncthreads();
    for (int e = t; e < kKeys * HD; e += kThreads) {
      const int j = e / HD, d = e % HD;
      float kval = 0.0f, vval = 0.0f;
      if (j < n_c && d < hd) {
        const int64_t idx = key_base[j] + d;
        kval = CacheElem<T>::load(static_cast<const T*>(kv.k), idx);
        vval = CacheElem<T>::load(static_cast<const T*>(kv.v), idx);
      }
      ks[j * QP + d] = kval;
      vs[j * HD + d] = vval;
    }
    __syncthreads();

    // Scores of this thread's rows against keys tx and tx + 16.
    float sc[kRowReps][2];
#pragma unroll
    for (int q = 0; q < kRowReps; ++q) sc[q][0] = sc[q][1] = 0.0f;
    for (int64_t d = 0; d < hd; d += 4) {
      const float4 k0 = *reinterpret_cast<const float4*>(ks + tx * QP + d);
      const float4 k1 = *reinterpret_cast<const float4*>(ks + (tx + 16) * QP + d);
#pragma unroll
      for (int q = 0; q < kRowReps; ++q) {
        const float4 qv = *reinterpret_cast<const float4*>(qs + (kRowReps * ty + q) * QP + d);
        sc[q][0] = dot4(qv, k0, sc[q][0]);
        sc[q][1] = dot4(qv, k1, sc[q][1]);
      }
    }
    float p0[kRowReps], p1[kRowReps];
#pragma unroll
    for (int q = 0; q < kRowReps; ++q) {
      float mx = -INFINITY;
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int j = tx + 16 * p;
        const int32_t key = int32_t(c0) + j;
        const bool allowed = j < n_c && key <= pos[q] && key >= lo[q];
        sc[q][p] = allowed ? sc[q][p] * scale : -INFINITY;
        if (allowed && a.softcap > 0) sc[q][p] = a.softcap * tanhf(sc[q][p] / a.softcap);  // Gemma 2's soft cap
        mx = fmaxf(mx, sc[q][p]);
      }
      // The 16 threads of a row are 16 consecutive lanes of one warp.
#pragma unroll
      for (int off = 8; off > 0; off /= 2) mx = fmaxf(mx, shfl_xor(mx, off));
      const float new_m = fmaxf(m[q], mx);
      const bool any = new_m != -INFINITY;  // uniform over the row's lanes, not over the warp
      p0[q] = any && sc[q][0] != -INFINITY ? expf(sc[q][0] - new_m) : 0.0f;
      p1[q] = any && sc[q][1] != -INFINITY ? expf(sc[q][1] - new_m) : 0.0f;
      float sum = p0[q] + p1[q];
#pragma unroll
      for (int off = 8; off > 0; off /= 2) sum += shfl_xor(sum, off);  // every lane: no divergence here
      if (any) {
        const float corr = expf(m[q] - new_m);  // 0 while the row had no key (m = -inf)
        l[q] = l[q] * corr + sum;
        m[q] = new_m;
#pragma unroll
        for (int c = 0; c < 4 * kVecs; ++c) o[q][c] *= corr;
      }
    }
    if constexpr (kRowReps == 4) {
      *reinterpret_cast<float4*>(ps + tx * PP + 4 * ty) = make_float4(p0[0], p0[1], p0[2], p0[3]);
      *reinterpret_cast<float4*>(ps + (tx + 16) * PP + 4 * ty) = make_float4(p1[0], p1[1], p1[2], p1[3]);
    } else {
#pragma unroll
      for (int q = 0; q < kRowReps; ++q) {
        ps[tx * PP + kRowReps * ty + q] = p0[q];
        ps[(tx + 16) * PP + kRowReps * ty + q] = p1[q];
      }
    }
    __syncthreads();
    for (int j = 0; j < n_c; ++j) {
      float pj[kRowReps];
      if constexpr (kRowReps == 4) {
        const float4 p4 = *reinterpret_cast<const float4*>(ps + j * PP + 4 * ty);
        pj[0] = p4.x, pj[1] = p4.y, pj[2] = p4.z, pj[3] = p4.w;
      } else {
#pragma unroll
        for (int q = 0; q < kRowReps; ++q) pj[q] = ps[j * PP + kRowReps * ty + q];
      }
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const float4 vv = *reinterpret_cast<const float4*>(vs + j * HD + 64 * v + 4 * tx);
#pragma unroll
        for (int q = 0; q < kRowReps; ++q) {
          o[q][4 * v] = fmaf(pj[q], vv.x, o[q][4 * v]);
          o[q][4 * v + 1] = fmaf(pj[q], vv.y, o[q][4 * v + 1]);
          o[q][4 * v + 2] = fmaf(pj[q], vv.z, o[q][4 * v + 2]);
          o[q][4 * v + 3] = fmaf(pj[q], vv.w, o[q][4 * v + 3]);
        }
      }
    }
  }

  // Output dimension of o[q][4 v + c]: 64 v + 4 tx + c.
#pragma unroll
  for (int q = 0; q < kRowReps; ++q) {
    const int r = kRowReps * ty + q;
    if (r >= nrows) continue;
    if (splits == 1) {
      const int64_t f = f0 + r;
      float* out = a.out + (s.q_start + f / group) * q_stride + (h * group + f % group) * hd;
      const float inv = 1.0f / l[q];
#pragma unroll
      for (int c = 0; c < 4 * kVecs; ++c) {
        const int64_t d = 64 * (c / 4) + 4 * tx + c % 4;
        if (d < hd) out[d] = o[q][c] * inv;
      }
    } else {
      // partial[(((seq * kv heads + h) * tiles + tile) * splits + split) * R + r] holds m, l, o[HD].
      const int64_t idx = (((seq * kv.n_kv_heads + h) * tiles + tile) * splits + split) * R + r;
      float* rec = partial + idx * (HD + 2);
      if (tx == 0) {
        rec[0] = m[q];
        rec[1] = l[q];
      }
#pragma unroll
      for (int c = 0; c < 4 * kVecs; ++c) rec[2 + 64 * (c / 4) + 4 * tx + c % 4] = o[q][c];
    }
  }
}

// Causal tiles late in a prompt see many more keys than early ones, so a block takes two tiles from
// opposite ends (p and tiles - 1 - p): every block does about the same work, instead of the launch
// lasting as long as its last tile alone.
template <class T, int kRowReps, int kDimReps>
__global__ void __launch_bounds__(kThreads, 2)
    dense_attention_kernel(AttnParams a, KvPools kv, int tiles, int splits, float* __restrict__ partial) {
  extern __shared__ float smem[];
  __shared__ int64_t key_base[kKeys];
  const int pair = int(blockIdx.z) / splits, split = int(blockIdx.z) % splits;
  attend_tile<T, kRowReps, kDimReps>(a, kv, pair, tiles, split, splits, partial, smem, key_base);
  const int other = tiles - 1 - pair;
  if (other != pair) attend_tile<T, kRowReps, kDimReps>(a, kv, other, tiles, split, splits, partial, smem, key_base);
}

// Merges the splits of each row: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
template <int kRowReps, int kDimReps>
__global__ void merge_splits_kernel(AttnParams a, KvPools kv, int tiles, int splits, const float* __restrict__ partial) {
  using TL = Tile<kRowReps, kDimReps>;
  constexpr int R = TL::R, HD = TL::HD;
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const int tile = int(blockIdx.z);
  const SeqDesc s = a.seqs[seq];
  const int64_t rows_total = int64_t(s.q_len) * group;
  const int64_t f0 = int64_t(tile) * R;
  if (f0 >= rows_total) return;
  const int nrows = int(min(int64_t(R), rows_total - f0));
  const int64_t q_stride = a.n_heads * hd;
  for (int e = threadIdx.x; e < nrows * hd; e += blockDim.x) {
    const int r = e / int(hd), d = e % int(hd);
    const int64_t base = (((seq * kv.n_kv_heads + h) * tiles + tile) * splits) * R + r;
    float mx = -INFINITY;
    for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, partial[(base + int64_t(sp) * R) * (HD + 2)]);
    float num = 0.0f, den = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
      const float* rec = partial + (base + int64_t(sp) * R) * (HD + 2);
      if (rec[0] == -INFINITY) continue;  // a split with no key for this row
      const float w = expf(rec[0] - mx);
      den += rec[1] * w;
      num += rec[2 + d] * w;
    }
    const int64_t f = f0 + r;
    a.out[(s.q_start + f / group) * q_stride + (h * group + f % group) * hd + d] = num / den;
  }
}

struct Shape {
  int row_reps, dim_reps, tiles, splits;
};

Shape shape_of(const AttnParams& a, const KvPools& kv) {
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t rows = int64_t(a.max_q_len) * group;
  Shape sh{};
  sh.dim_reps = kv.head_dim <= 64 ? 4 : 8;
  sh.row_reps = (rows > 16 && sh.dim_reps == 4) ? 4 : 1;  // 64-row tiles fit shared memory up to head size 64
  const int64_t r = 16 * sh.row_reps;
  sh.tiles = int((rows + r - 1) / r);
  // Only single-tile launches (decode, short chunks) split: a prefill has blocks enough, and the
  // merge would cost more than the split saves.
  const int64_t blocks = a.n_seqs * kv.n_kv_heads;
  const int64_t by_context = (a.max_context_len + kSplitKeys - 1) / kSplitKeys;
  const int64_t by_blocks = (kTargetBlocks + blocks - 1) / blocks;
  sh.splits = sh.tiles > 1 ? 1 : int(std::max<int64_t>(1, std::min<int64_t>({by_context, by_blocks, kMaxSplits})));
  return sh;
}

template <class T, int kRowReps, int kDimReps>
void launch(const AttnParams& a, const KvPools& kv, const Shape& sh, float* partial, cudaStream_t stream) {
  using TL = Tile<kRowReps, kDimReps>;
  const dim3 grid(static_cast<unsigned>(a.n_seqs), static_cast<unsigned>(kv.n_kv_heads),
                  static_cast<unsigned>((sh.tiles + 1) / 2 * sh.splits));
  dense_attention_kernel<T, kRowReps, kDimReps><<<grid, kThreads, TL::kSmem, stream>>>(a, kv, sh.tiles, sh.splits,
                                                                                         partial);
  if (sh.splits > 1) {
    const dim3 merge_grid(static_cast<unsigned>(a.n_seqs), static_cast<unsigned>(kv.n_kv_heads),
                          static_cast<unsigned>(sh.tiles));
    merge_splits_kernel<kRowReps, kDimReps><<<merge_grid, kThreads, 0, stream>>>(a, kv, sh.tiles, sh.splits, partial);
  }
}

template <class T>
void launch_type(const AttnParams& a, const KvPools& kv, const Shape& sh, float* partial, cudaStream_t stream) {
  if (sh.dim_reps == 4) {
    if (sh.row_reps == 4) return launch<T, 4, 4>(a, kv, sh, partial, stream);
    return launch<T, 1, 4>(a, kv, sh, partial, stream);
  }
  launch<T, 1, 8>(a, kv, sh, partial, stream);
}

}  // namespace

int32_t attention_context_bucket(int32_t max_context_len) {
  const int64_t rounded = (int64_t(max_context_len) + kSplitKeys - 1) / kSplitKeys * kSplitKeys;
  return int32_t(std::min<int64_t>(rounded, INT32_MAX));
}

bool dense_attention_applies(const AttnParams& a, const KvPools& kv) {
  return a.sparse_block <= 0 && kv.head_dim <= 128 && kv.head_dim % 4 == 0;  // float4 rows
}

size_t dense_attention_scratch_bytes(const AttnParams& a, const KvPools& kv) {
  if (a.n_seqs <= 0 || a.max_q_len <= 0 || !dense_attention_applies(a, kv)) return 0;
  const Shape sh = shape_of(a, kv);
  if (sh.splits == 1) return 0;
  const int64_t r = 16 * sh.row_reps, hd = 16 * sh.dim_reps;
  return size_t(a.n_seqs * kv.n_kv_heads * sh.tiles * sh.splits * r * (hd + 2)) * sizeof(float);
}

void dense_attention(const AttnParams& a, const KvPools& kv, float* scratch, cudaStream_t stream) {
  if (a.n_seqs <= 0 || a.max_q_len <= 0) return;
  const Shape sh = shape_of(a, kv);
  switch (kv.type) {
    case CacheType::f32: return launch_type<float>(a, kv, sh, scratch, stream);
    case CacheType::f16: return launch_type<Half>(a, kv, sh, scratch, stream);
    case CacheType::bf16: return launch_type<BHalf>(a, kv, sh, scratch, stream);
  }
}

}  // namespace tessera::gpu
