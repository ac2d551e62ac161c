// Causal attention over paged KV for a ragged batch, flash-style: keys are visited in blocks with an
// online softmax, so no score matrix is materialised. Each key/value row is read once per query for
// its whole GQA group (decode: for a band of kv heads at once, see run_band). Scores, exponentials
// and the value sum are vectorised per block.
//
// Past 64 keys, a query's keys are cut into segments (segment_keys: about eight, of whole eights
// of keys, by the query's key count alone); each segment's softmax state is computed on its own
// and the states are folded in key order (fold_segment). Decode splits a sequence's segments
// between threads, so that each thread reads whole K and V rows one after another (split by heads,
// each thread read part of every row: an int8 110m decode of 1000 tokens spent 12-19% more time
// in attention, in 3 alternating pairs of runs). Prefill and verification fold the same segments
// in the same order: a query's output has the same bits alone or with others, whatever the number
// of threads.
//
// With AVX2 or AVX-512 (VecOps::dot_cols2, RowOps::dot_rows2 / weighted_sum2) two queries that
// share keys go together, each key and value row read once for both: a GQA group's queries in
// pairs (prefill and decode), and in MHA prefill a head's consecutive positions whose keys are cut
// into the same segments (two_queries). Every step of each query is the one-query path's, so the
// same bits (AVX-512: BM_AttentionOp/2048/1, 8 heads on 2, 52-60 -> 40-45 ms; BM_Prefill/2048/0,
// 4 heads of 64 without groups, 251-293 -> 199-201 ms; AVX2 (TESSERA_CPU_ISA=avx2): 3-9% on
// BM_Prefill/2048/0 and BM_DecodeAttentionColdGqa/512/0; 3 alternating runs each, Zen 5).
//
// Decode reads its cold K/V at 15-21 GB/s (latency, not bandwidth). Loading those rows during the
// preceding q|k|v GEMV (its threads touching a share of the lines per claim of weights) was
// measured and not kept: at 7-135 keys attention took 30-40% less time but the GEMV as much more
// (roofline share unchanged), and at 1000 keys decode was 6-19% slower (6 alternating pairs).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"
#include "tessera/error.h"
#include "vec_math_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kQueryTask = -1;  // run_task
constexpr int64_t kBandOutput = -2;  // run_band over a query's only segment, writing the output

struct Task {
  int64_t seq;
  int64_t kv_head;
  int64_t q_begin;
  int64_t q_end;
  int64_t kv_head_end;  // a decode task's band of kv heads [kv_head, kv_head_end), walked together
  int64_t key_lo = 0, key_hi = -1;  // a decode task's segment of keys [key_lo, key_hi]
  int64_t state = kQueryTask;  // a decode task's states (offset, see run_band), or kBandOutput
};

// A decode sequence's band of kv heads: its segments' states, folded into the output.
struct FoldJob {
  int64_t seq, kv_head, kv_head_end;
  int64_t state;     // the first segment's states; the others follow, segment after segment
  int64_t segments;
};

constexpr int64_t kMaxGroup = 64;
constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kKeyBlock = 64;
constexpr int64_t kSegments = 8;
constexpr int64_t kOneSegmentKeys = 64;

// Keys per segment for a query that sees `keys` keys: up to kOneSegmentKeys, one segment (a
// decode splits its heads between threads instead: fewer tasks, no fold); past that whole eights
// (the transposed keys' chunks), about kSegments segments, so that a decode has work for as many
// threads.
int64_t segment_keys(int64_t keys) {
  return keys <= kOneSegmentKeys ? keys : ((keys + kSegments - 1) / kSegments + 7) / 8 * 8;
}

// Gemma 2's soft cap on n scaled scores, in place: cap * tanh(s / cap); returns their new maximum.
float soft_cap(float* s, int n, float cap) {
  float max = -INFINITY;
  for (int i = 0; i < n; ++i) {
    s[i] = cap * std::tanh(s[i] / cap);
    max = std::max(max, s[i]);
  }
  return max;
}

// Folds a segment's softmax state (max mb, sum lb, value sum accb) into a running one (m, l, acc).
// Not inlined: decode and prefill fold with the same instructions (no FMA contraction in one and
// not the other), hence the same bits.
__attribute__((noinline)) void fold_segment(float& m, float& l, float* acc, float mb, float lb, const float* accb,
                                            int64_t hd) {
  const float new_m = std::max(m, mb);
  const float ca = std::exp(m - new_m), cb = std::exp(mb - new_m);
  l = l * ca + lb * cb;
  for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * ca + accb[d] * cb;
  m = new_m;
}

// A query's output from its final state: the value sum over the exponentials' sum.
void finish_query(const float* acc, float l, int64_t hd, float* out) {
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
}

// Addresses of keys [first_key, first_key + n) of one kv head, K and V, from the sequence's block
// table. Walks the table instead of dividing per key (a division costs more than the dot product of
// a small head).
void gather_rows(const KvLayerView& kv, const int32_t* table, const uint8_t* kbase, const uint8_t* vbase,
                 int64_t first_key, int64_t n, std::vector<const void*>& krows, std::vector<const void*>& vrows) {
  const size_t row_bytes = dtype_row_bytes(kv.dtype, kv.token_stride());
  krows.resize(size_t(n));
  vrows.resize(size_t(n));
  int64_t kb = first_key / kv.block_size, off = first_key % kv.block_size;
  for (size_t j = 0; j < size_t(n); ++j) {
    const size_t slot = size_t(table[kb]) * size_t(kv.block_size) + size_t(off);
    krows[j] = kbase + slot * row_bytes;
    vrows[j] = vbase + slot * row_bytes;
    if (++off == kv.block_size) {
      off = 0;
      ++kb;
    }
  }
}

void run_task(const AttentionArgs& a, const KvLayerView& kv, const Task& t, const VecOps& ops) {
  const AttentionSeqDesc& s = a.seqs[t.seq];
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t q_stride = a.n_heads * hd;
  const int32_t* table = a.block_tables + s.block_table_offset;
  const size_t head_bytes = dtype_row_bytes(kv.dtype, hd);
  const auto* kbase = static_cast<const uint8_t*>(kv.k) + t.kv_head * head_bytes;
  const auto* vbase = static_cast<const uint8_t*>(kv.v) + t.kv_head * head_bytes;
  const int64_t first_pos = s.context_len - s.q_len;
  // Rows as the cache stores them; f16 and bf16 are widened in registers, so a half cache gives
  // the bits of an f32 cache holding the same (rounded) values.
  const RowOps& rows = ops.rows(kv.dtype);

  float m[kMaxGroup], l[kMaxGroup];
  alignas(32) float acc[kMaxGroup * kMaxHeadDim];
  alignas(32) float scores[2][kKeyBlock + 16];
  // Key and value rows of every key some query of this task may see, gathered once: the queries
  // of a prefill chunk or a speculative verification share them.
  const bool windowed = a.window > 0 && a.sparse.block == 0;
  // From a multiple of 8, the keys' chunk boundary in the transposed copy below.
  const int64_t first_key = windowed ? std::max<int64_t>(0, first_pos + t.q_begin - a.window + 1) / 8 * 8 : 0;
  const int64_t last_key = first_pos + t.q_end - 1;
  thread_local std::vector<const void*> krows_all, vrows_all;
  const int64_t n_keys = last_key - first_key + 1;
  gather_rows(kv, table, kbase, vbase, first_key, n_keys, krows_all, vrows_all);
  // With two or more queries (a GQA group, a prefill chunk, a verification) the keys are
  // transposed in chunks of 8 once for all of them (see VecOps): their scores then take no
  // horizontal sums. A lone query (MHA decode) reads the rows. Both give the same bits.
  const bool transposed = group * (t.q_end - t.q_begin) >= 2;
  thread_local std::vector<float> kt;
  if (transposed) {
    kt.resize(size_t((n_keys + 7) / 8 * 8 * hd));
    rows.transpose_rows(krows_all.data(), n_keys, hd, kt.data());
  }
  // Block-sparse: this sequence's kept key blocks for (kv head, query block).
  const BlockSparseLayout& sp = a.sparse;
  const bool sparse = sp.block > 0 && sp.seq_base[t.seq] >= 0;
  const int64_t first_qb = sparse ? first_pos / sp.block : 0;
  const int64_t n_qb = sparse ? (s.context_len - 1) / sp.block - first_qb + 1 : 0;

  // A segment's states, before they are folded into m, l and acc.
  float sm[kMaxGroup], sl[kMaxGroup];
  thread_local std::vector<float> sacc;
  sacc.resize(size_t(std::max<int64_t>(group, 2) * hd));
  // The group's queries scored and summed two at a time where the CPU has that (dot_cols2,
  // weighted_sum2): hd % 8, as dot_cols's vector path needs.
  const bool pairs = transposed && group >= 2 && hd % 8 == 0 && ops.dot_cols2 != nullptr && rows.weighted_sum2 != nullptr;
  // Without a group (MHA), consecutive positions two at a time (two_queries) where their keys are
  // cut into the same segments, and where a value sum cut in two gives the bits of one (column
  // chains: heads of a multiple of 8 past 16).
  const bool position_pairs = transposed && group == 1 && !sparse && a.window == 0 && a.softcap == 0 && hd % 8 == 0 && hd > 16 &&
                              ops.dot_cols2 != nullptr && rows.weighted_sum2 != nullptr;
  thread_local std::vector<float> qpairs;
  if (pairs || position_pairs) qpairs.resize(size_t(std::max<int64_t>(group / 2, 1) * hd * 16));
  auto fresh = [&](float* m, float* l, float* acc) {
    std::fill(m, m + group, -INFINITY);
    std::fill(l, l + group, 0.0f);
    std::fill(acc, acc + group * hd, 0.0f);
  };
  // Queries qi and qi + 1 of one head (position_pairs): each block of keys scored for both at once
  // (dot_cols2) and its values summed for both (weighted_sum2), the later query's extra last key
  // summed after; every step of each query as the one-query path below takes it, so the same bits.
  auto two_queries = [&](int64_t qi) {
    const int64_t pa = first_pos + qi, pb = pa + 1;
    const float* qa = a.q + (s.q_start + qi) * q_stride + t.kv_head * hd;
    ops.pair_queries(qa, qa + q_stride, hd, qpairs.data());
    // Online softmax over keys [lo, hi_a] for query a (none when hi_a < lo) and [lo, hi_b] for b.
    auto visit2 = [&](int64_t lo, int64_t hi_a, int64_t hi_b, float* m2, float* l2, float* const* acc2) {
      for (int64_t b = lo; b <= hi_b; b += kKeyBlock) {
        const int n2[2] = {b <= hi_a ? static_cast<int>(std::min<int64_t>(kKeyBlock, hi_a + 1 - b)) : 0,
                           static_cast<int>(std::min<int64_t>(kKeyBlock, hi_b + 1 - b))};
        const int skip = static_cast<int>((b - first_key) % 8);
        const float* kchunks = kt.data() + (b - first_key) / 8 * 8 * hd;
        const void* const* vrows = vrows_all.data() + (b - first_key);
        float maxes[2];
        if (n2[0] > 0) {
          ops.dot_cols2(qpairs.data(), kchunks, skip + n2[0], skip + n2[1], skip, hd, a.scale, scores[0], scores[1], maxes);
        } else {
          maxes[1] = ops.dot_cols(qa + q_stride, kchunks, skip + n2[1], skip, hd, a.scale, scores[1]);
        }
        for (int x = 0; x < 2; ++x) {
          if (n2[x] == 0) continue;
          const float new_m = std::max(m2[x], maxes[x]);
          const float correction = std::exp(m2[x] - new_m);
          if (correction != 1.0f) {
            for (int64_t d = 0; d < hd; ++d) acc2[x][d] *= correction;
          }
          l2[x] = l2[x] * correction + ops.exp_shift(scores[x] + skip, n2[x], new_m);
          m2[x] = new_m;
        }
        if (n2[0] > 0) rows.weighted_sum2(scores[0] + skip, scores[1] + skip, vrows, n2[0], hd, acc2[0], acc2[1]);
        if (n2[1] > n2[0]) rows.weighted_sum(scores[1] + skip + n2[0], vrows + n2[0], n2[1] - n2[0], hd, acc2[1]);
      }
    };
    const int64_t seg = segment_keys(pa + 1);  // = segment_keys(pb + 1): the caller checked
    float m2[2], l2[2], sm2[2], sl2[2];
    float* const acc2[2] = {acc, acc + hd};
    float* const sacc2[2] = {sacc.data(), sacc.data() + hd};
    auto fresh2 = [&](float* m, float* l, float* const* acc) {
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.0f;
      std::fill(acc[0], acc[0] + hd, 0.0f);
      std::fill(acc[1], acc[1] + hd, 0.0f);
    };
    fresh2(m2, l2, acc2);
    visit2(0, std::min(pa, seg - 1), std::min(pb, seg - 1), m2, l2, acc2);
    for (int64_t s0 = seg; s0 <= pb; s0 += seg) {
      fresh2(sm2, sl2, sacc2);
      visit2(s0, s0 <= pa ? std::min(pa, s0 + seg - 1) : s0 - 1, std::min(pb, s0 + seg - 1), sm2, sl2, sacc2);
      if (s0 <= pa) fold_segment(m2[0], l2[0], acc2[0], sm2[0], sl2[0], sacc2[0], hd);
      fold_segment(m2[1], l2[1], acc2[1], sm2[1], sl2[1], sacc2[1], hd);
    }
    float* out = a.out + (s.q_start + qi) * q_stride + t.kv_head * hd;
    finish_query(acc2[0], l2[0], hd, out);
    finish_query(acc2[1], l2[1], hd, out + q_stride);
  };
  for (int64_t qi = t.q_begin; qi < t.q_end; ++qi) {
    const int64_t pos = first_pos + qi;
    if (position_pairs && qi + 1 < t.q_end && segment_keys(pos + 1) == segment_keys(pos + 2)) {
      two_queries(qi++);
      continue;
    }
    const float* q = a.q + (s.q_start + qi) * q_stride + t.kv_head * group * hd;
    for (int64_t g = 0; pairs && g + 1 < group; g += 2) {
      ops.pair_queries(q + g * hd, q + (g + 1) * hd, hd, qpairs.data() + g / 2 * hd * 16);
    }
    // Online softmax over keys [lo, hi], in chunks of kKeyBlock, continuing the state in m, l, acc.
    auto visit = [&](int64_t lo, int64_t hi, float* m, float* l, float* acc) {
      for (int64_t b = lo; b <= hi; b += kKeyBlock) {
        const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, hi + 1 - b));
        // Transposed: scores from the chunk holding key b; `skip` keys before b are computed and
        // ignored.
        const int skip = transposed ? static_cast<int>((b - first_key) % 8) : 0;
        const float* kchunks = transposed ? kt.data() + (b - first_key) / 8 * 8 * hd : nullptr;
        const void* const* krows = krows_all.data() + (b - first_key);
        const void* const* vrows = vrows_all.data() + (b - first_key);
        float maxes[2];
        for (int64_t g = 0; g < group; ++g) {
          float* const out = scores[g % 2];
          float* const sb = out + skip;
          if (pairs && g % 2 == 0 && g + 1 < group) {
            ops.dot_cols2(qpairs.data() + g / 2 * hd * 16, kchunks, skip + n, skip + n, skip, hd, a.scale, out,
                          scores[1], maxes);
          }
          const float block_max = pairs && (g % 2 == 1 || g + 1 < group)
                                      ? maxes[g % 2]
                                  : transposed ? ops.dot_cols(q + g * hd, kchunks, skip + n, skip, hd, a.scale, out)
                                               : rows.dot_rows(q + g * hd, krows, n, hd, a.scale, out);
          const float new_m = std::max(m[g], a.softcap > 0 ? soft_cap(sb, n, a.softcap) : block_max);
          const float correction = std::exp(m[g] - new_m);  // 0 on the first block (m = -inf)
          float* ag = acc + g * hd;
          if (correction != 1.0f) {
            for (int64_t d = 0; d < hd; ++d) ag[d] *= correction;
          }
          l[g] = l[g] * correction + ops.exp_shift(sb, n, new_m);
          m[g] = new_m;
          // A pair's value sums after both its queries' weights (each query's steps in order).
          if (!pairs || (g % 2 == 0 && g + 1 == group)) {
            rows.weighted_sum(sb, vrows, n, hd, ag);
          } else if (g % 2 == 1) {
            rows.weighted_sum2(scores[0] + skip, sb, vrows, n, hd, ag - hd, ag);
          }
        }
      }
    };
    if (sparse) {
      // Kept blocks in one online pass (sparse decode comes here too).
      fresh(m, l, acc);
      const int64_t entry = sp.seq_base[t.seq] + t.kv_head * n_qb + (pos / sp.block - first_qb);
      for (int32_t i = sp.offsets[entry]; i < sp.offsets[entry + 1]; ++i) {
        const int64_t lo = int64_t(sp.kept[i]) * sp.block;
        if (lo <= pos) visit(lo, std::min(pos, lo + sp.block - 1), m, l, acc);
      }
    } else {
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      const int64_t seg = segment_keys(pos - lo + 1);
      fresh(m, l, acc);
      visit(lo, std::min(pos, lo + seg - 1), m, l, acc);
      for (int64_t s0 = lo + seg; s0 <= pos; s0 += seg) {
        fresh(sm, sl, sacc.data());
        visit(s0, std::min(pos, s0 + seg - 1), sm, sl, sacc.data());
        for (int64_t g = 0; g < group; ++g) {
          fold_segment(m[g], l[g], acc + g * hd, sm[g], sl[g], sacc.data() + g * hd, hd);
        }
      }
    }
    float* out = a.out + (s.q_start + qi) * q_stride + t.kv_head * group * hd;
    for (int64_t g = 0; g < group; ++g) finish_query(acc + g * hd, l[g], hd, out + g * hd);
  }
}

// Decode (one query per head) over one segment of keys for a band of kv heads, walked together
// eight keys at a time: a kv head's rows are strided by the token's whole row in the cache, and
// reading the band's part of each row at once lets the hardware prefetcher stream it (one head
// after another, each key's 256 bytes come from another 3 KiB row and the prefetcher cannot
// follow). Every query of a GQA group scores the eight rows while they are in L1, with dot_rows:
// the same bits as run_task's transposed keys. Each query's arithmetic is run_task's for the
// segment, in the same order (key blocks, block max, correction, exponentials, value sum in key
// order; cut into eights only where that changes no bits). Writes each query j's state, unscaled,
// at states + j * (hd + 2): max, sum, value sum; without states (a query's only segment), the
// output, as fold_band would.
void run_band(const AttentionArgs& a, const KvLayerView& kv, const Task& t, const VecOps& ops, float* states) {
  const AttentionSeqDesc& s = a.seqs[t.seq];
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t heads = t.kv_head_end - t.kv_head;
  const int64_t queries = heads * group;  // query j = h * group + g
  const size_t head_bytes = dtype_row_bytes(kv.dtype, hd);
  const RowOps& rows = ops.rows(kv.dtype);
  const int64_t lo = t.key_lo, hi = t.key_hi;
  thread_local std::vector<const void*> krows, vrows;
  gather_rows(kv, a.block_tables + s.block_table_offset,
              static_cast<const uint8_t*>(kv.k) + t.kv_head * head_bytes,
              static_cast<const uint8_t*>(kv.v) + t.kv_head * head_bytes, lo, hi - lo + 1, krows, vrows);
  const float* q = a.q + (s.q_start + t.q_begin) * a.n_heads * hd + t.kv_head * group * hd;
  float m[kMaxGroup], l[kMaxGroup], block_max[kMaxGroup];
  alignas(32) float acc[kMaxGroup * kMaxHeadDim];
  alignas(32) float scores[kMaxGroup][kKeyBlock];
  std::fill(m, m + queries, -INFINITY);
  std::fill(l, l + queries, 0.0f);
  std::fill(acc, acc + queries * hd, 0.0f);
  // A GQA group's queries two at a time where the CPU has that (each row read once for both):
  // query j leads a pair with j + 1, or is the second of one (done with its pair), or is alone.
  const bool pairs = group >= 2 && rows.dot_rows2 != nullptr && rows.weighted_sum2 != nullptr;
  auto leads_pair = [&](int64_t j) { return pairs && j % group % 2 == 0 && j % group + 1 < group; };
  auto second_of_pair = [&](int64_t j) { return pairs && j % group % 2 == 1; };
  // body(j, c, nc, rows) for every query j, over the band's rows of eight keys (head h's part at
  // byte offset h * head_bytes).
  auto for_eights = [&](int64_t b, int n, const std::vector<const void*>& from, auto&& body) {
    for (int c = 0; c < n; c += 8) {
      const int nc = std::min(8, n - c);
      for (int64_t h = 0; h < heads; ++h) {
        const void* r[8];
        for (int u = 0; u < nc; ++u) r[u] = static_cast<const uint8_t*>(from[size_t(b - lo + c + u)]) + h * head_bytes;
        for (int64_t j = h * group; j < (h + 1) * group; ++j) body(j, c, nc, r);
      }
    }
  };
  for (int64_t b = lo; b <= hi; b += kKeyBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, hi + 1 - b));
    std::fill(block_max, block_max + queries, -INFINITY);
    for_eights(b, n, krows, [&](int64_t j, int c, int nc, const void* const* r) {
      if (leads_pair(j)) {
        float maxes[2];
        rows.dot_rows2(q + j * hd, q + (j + 1) * hd, r, nc, hd, a.scale, scores[j] + c, scores[j + 1] + c, maxes);
        block_max[j] = std::max(block_max[j], maxes[0]);
        block_max[j + 1] = std::max(block_max[j + 1], maxes[1]);
      } else if (!second_of_pair(j)) {
        block_max[j] = std::max(block_max[j], rows.dot_rows(q + j * hd, r, nc, hd, a.scale, scores[j] + c));
      }
    });
    for (int64_t j = 0; j < queries; ++j) {
      if (a.softcap > 0) block_max[j] = soft_cap(scores[j], n, a.softcap);
      const float new_m = std::max(m[j], block_max[j]);
      const float correction = std::exp(m[j] - new_m);
      float* aj = acc + j * hd;
      if (correction != 1.0f) {
        for (int64_t d = 0; d < hd; ++d) aj[d] *= correction;
      }
      l[j] = l[j] * correction + ops.exp_shift(scores[j], n, new_m);
      m[j] = new_m;
    }
    for_eights(b, n, vrows, [&](int64_t j, int c, int nc, const void* const* r) {
      if (leads_pair(j)) {
        rows.weighted_sum2(scores[j] + c, scores[j + 1] + c, r, nc, hd, acc + j * hd, acc + (j + 1) * hd);
      } else if (!second_of_pair(j)) {
        rows.weighted_sum(scores[j] + c, r, nc, hd, acc + j * hd);
      }
    });
  }
  if (states == nullptr) {
    float* out = a.out + (s.q_start + t.q_begin) * a.n_heads * hd + t.kv_head * group * hd;
    for (int64_t j = 0; j < queries; ++j) finish_query(acc + j * hd, l[j], hd, out + j * hd);
    return;
  }
  for (int64_t j = 0; j < queries; ++j) {
    float* st = states + j * (hd + 2);
    st[0] = m[j];
    st[1] = l[j];
    std::copy(acc + j * hd, acc + (j + 1) * hd, st + 2);
  }
}

// A decode band's output: its segments' states folded in key order, as run_task folds them.
void fold_band(const AttentionArgs& a, const KvLayerView& kv, const FoldJob& f, const float* states) {
  const AttentionSeqDesc& s = a.seqs[f.seq];
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t queries = (f.kv_head_end - f.kv_head) * group;
  const int64_t stride = queries * (hd + 2);  // one segment's states
  float* out = a.out + s.q_start * a.n_heads * hd + f.kv_head * group * hd;
  alignas(32) float acc[kMaxHeadDim];
  for (int64_t j = 0; j < queries; ++j) {
    const float* st = states + f.state + j * (hd + 2);
    float m = st[0], l = st[1];
    std::copy(st + 2, st + 2 + hd, acc);
    for (int64_t sg = 1; sg < f.segments; ++sg) {
      const float* more = st + sg * stride;
      fold_segment(m, l, acc, more[0], more[1], more + 2, hd);
    }
    finish_query(acc, l, hd, out + j * hd);
  }
}

}  // namespace

void attention(const AttentionArgs& a, const KvLayerView& kv) {
  if (!kv_type_supported(kv.dtype)) {
    throw Error("cpu attention supports an f32, f16 or bf16 cache, not " + std::string(dtype_name(kv.dtype)));
  }
  if (a.n_heads % kv.n_kv_heads != 0 || a.n_heads / kv.n_kv_heads > kMaxGroup || kv.head_dim > kMaxHeadDim) {
    throw Error("cpu attention: unsupported head layout (" + std::to_string(a.n_heads) + " heads, " +
                std::to_string(kv.n_kv_heads) + " kv heads, head size " + std::to_string(kv.head_dim) + ")");
  }
  const VecOps& ops = vec_ops();
  // Split work into (sequence, kv head, query chunk) tasks of similar size.
  thread_local std::vector<Task> tasks;
  tasks.clear();
  int64_t pairs = 0, kv_read = 0;  // pairs: (query, key) of every sequence
  for (int64_t si = 0; si < a.n_seqs; ++si) {
    pairs += int64_t(a.seqs[si].q_len) * a.seqs[si].context_len;
    kv_read += a.seqs[si].context_len;
  }
  const int64_t work = pairs * a.n_heads * kv.head_dim;
  kv_read *= 2 * int64_t(dtype_row_bytes(kv.dtype, kv.token_stride()));
  // Decode attention forks from an eighth of the GEMMs' stream threshold: it runs between GEMVs
  // whose team is still spinning (a fork costs ~1 us then), and on one thread the other core sat
  // idle through it (at a 40-token context, a fifth of the worker's idle time in a Q4_0 decode).
  const int threads =
      work > kParallelWork || kv_read > kParallelStreamBytes / 8 ? team_max_threads() : 1;
  // Decode of a dense sequence goes in tasks of one segment of keys for a band of kv heads
  // (run_band): all of them where the segments keep the team busy, so that a thread takes
  // neighbouring segments, whole rows in key order. Heads of 16 or fewer keep run_task: their rows
  // are short, and their value sum's four key chains would round differently cut into eights.
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const bool bands = hd > 16;
  const int64_t max_band = kMaxGroup / group;
  thread_local std::vector<FoldJob> folds;
  folds.clear();
  int64_t n_states = 0;
  for (int64_t si = 0; si < a.n_seqs; ++si) {
    const AttentionSeqDesc& s = a.seqs[si];
    if (bands && s.q_len == 1 && !(a.sparse.block > 0 && a.sparse.seq_base[si] >= 0)) {
      const int64_t pos = s.context_len - 1;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      const int64_t seg = segment_keys(pos - lo + 1);
      const int64_t segments = (pos - lo + seg) / seg;
      // This sequence's share of the threads by its share of the keys: one task each for a
      // single segment (bands of heads), about two each for segments (bands of heads where the
      // segments are fewer).
      const int64_t share = (threads * s.context_len + pairs - 1) / pairs;
      const int64_t n_bands = std::clamp<int64_t>(segments == 1 ? share : (2 * share + segments - 1) / segments,
                                                  1, kv.n_kv_heads);
      const int64_t per_band = std::min((kv.n_kv_heads + n_bands - 1) / n_bands, max_band);
      for (int64_t h = 0; h < kv.n_kv_heads; h += per_band) {
        const int64_t h_end = std::min(kv.n_kv_heads, h + per_band);
        if (segments == 1) {
          tasks.push_back({si, h, 0, 1, h_end, lo, pos, kBandOutput});
          continue;
        }
        folds.push_back({si, h, h_end, n_states, segments});
        for (int64_t sg = 0; sg < segments; ++sg) {
          tasks.push_back({si, h, 0, 1, h_end, lo + sg * seg, std::min(pos, lo + (sg + 1) * seg - 1), n_states});
          n_states += (h_end - h) * group * (hd + 2);
        }
      }
      continue;
    }
    const int64_t chunk = std::max<int64_t>(1, (s.q_len + threads - 1) / threads);
    for (int64_t h = 0; h < kv.n_kv_heads; ++h) {
      for (int64_t q0 = 0; q0 < s.q_len; q0 += chunk) {
        tasks.push_back({si, h, q0, std::min<int64_t>(s.q_len, q0 + chunk), h + 1});
      }
    }
  }
  thread_local std::vector<float> state_buffer;
  state_buffer.resize(size_t(n_states));
  // Locals: inside the parallel region a thread_local name is the running thread's own.
  float* const states = state_buffer.data();
  const std::vector<Task>& list = tasks;
  const std::vector<FoldJob>& fold_list = folds;
  auto run = [&](const Task& t) {
    if (t.state != kQueryTask) {
      run_band(a, kv, t, ops, t.state == kBandOutput ? nullptr : states + t.state);
    } else {
      run_task(a, kv, t, ops);
    }
  };
  if (threads == 1) {  // not an `if` clause: see for_rows
    for (const Task& t : list) run(t);
    for (const FoldJob& f : fold_list) fold_band(a, kv, f, states);
    return;
  }
  StealingBands units(int64_t(list.size()), threads);
  const auto n_folds = static_cast<int64_t>(fold_list.size());
  team_run([&](int t, int nt) {
    for (UnitRange r; !(r = units.next(t)).empty();) {
      for (int64_t i = r.begin; i < r.end; ++i) run(list[size_t(i)]);
    }
    if (n_folds > 0) {
      team_barrier();
      const TeamSlice mine = team_slice(n_folds, t, nt);
      for (int64_t f = mine.begin; f < mine.end; ++f) fold_band(a, kv, fold_list[size_t(f)], states);
    }
  });
}

}  // namespace tessera::cpu
