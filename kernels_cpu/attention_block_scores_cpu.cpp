// Key-block scores for block-sparse prefill: the mean query of each query block (over its queries in
// this step and the kv head's query group) against the mean key of every causal key block. Costs
// O(tokens x head_dim) for the means plus O(query blocks x key blocks x head_dim) for the scores:
// small next to the attention it prunes.

#include <algorithm>
#include <string>
#include <vector>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

void attention_block_scores(const AttentionArgs& a, const KvLayerView& kv, float* scores) {
  const BlockSparseLayout& sp = a.sparse;
  if (sp.block <= 0) return;
  if (!kv_type_supported(kv.dtype)) {
    throw Error("cpu attention_block_scores supports an f32, f16 or bf16 cache, not " + std::string(dtype_name(kv.dtype)));
  }
  const int64_t hd = kv.head_dim;
  const int64_t group = a.n_heads / kv.n_kv_heads;
  const int64_t q_stride = a.n_heads * hd;
  const int64_t kv_stride = kv.token_stride();
  const int64_t n_kb_stride = (a.max_context_len + sp.block - 1) / sp.block;
  const auto* kpool = static_cast<const uint8_t*>(kv.k);
  const size_t row_bytes = dtype_row_bytes(kv.dtype, kv_stride), head_bytes = dtype_row_bytes(kv.dtype, hd);

  for (int64_t si = 0; si < a.n_seqs; ++si) {
    if (sp.seq_base[si] < 0) continue;
    const AttentionSeqDesc& s = a.seqs[si];
    const int32_t* table = a.block_tables + s.block_table_offset;
    const int64_t first_pos = s.context_len - s.q_len;
    const int64_t first_qb = first_pos / sp.block;
    const int64_t last_qb = (s.context_len - 1) / sp.block;
    const int64_t n_qb = last_qb - first_qb + 1;
    const int64_t n_kb = last_qb + 1;
    for_rows(kv.n_kv_heads, n_kb * sp.block * kv_stride > kParallelWork, [&](int64_t h) {
      std::vector<float> kmean(size_t(n_kb * hd), 0.0f);
      std::vector<float> qmean(static_cast<size_t>(hd)), key_row(static_cast<size_t>(hd));
      for (int64_t kb = 0; kb < n_kb; ++kb) {
        float* mean = kmean.data() + kb * hd;
        const int64_t end = std::min<int64_t>(s.context_len, (kb + 1) * sp.block);
        for (int64_t key = kb * sp.block; key < end; ++key) {
          const int64_t slot = int64_t(table[key / kv.block_size]) * kv.block_size + key % kv.block_size;
          const uint8_t* stored = kpool + size_t(slot) * row_bytes + size_t(h) * head_bytes;
          const float* row = reinterpret_cast<const float*>(stored);
          if (kv.dtype != DType::F32) {  // a half-precision cache
            unpack_row(kv.dtype, stored, key_row.data(), hd);
            row = key_row.data();
          }
          for (int64_t d = 0; d < hd; ++d) mean[d] += row[d];
        }
        const float inv = 1.0f / float(end - kb * sp.block);
        for (int64_t d = 0; d < hd; ++d) mean[d] *= inv;
      }
      for (int64_t qb = 0; qb < n_qb; ++qb) {
        std::fill(qmean.begin(), qmean.end(), 0.0f);
        const int64_t lo = std::max(first_pos, (first_qb + qb) * sp.block);
        const int64_t hi = std::min<int64_t>(s.context_len, (first_qb + qb + 1) * sp.block);
        for (int64_t pos = lo; pos < hi; ++pos) {
          const float* row = a.q + (s.q_start + pos - first_pos) * q_stride + h * group * hd;
          for (int64_t g = 0; g < group; ++g) {
            for (int64_t d = 0; d < hd; ++d) qmean[size_t(d)] += row[g * hd + d];
          }
        }
        const float inv = a.scale / float((hi - lo) * group);
        float* out = scores + (sp.seq_base[si] + h * n_qb + qb) * n_kb_stride;
        for (int64_t kb = 0; kb <= first_qb + qb; ++kb) {
          out[kb] = inv * dot_f32(qmean.data(), kmean.data() + kb * hd, hd);
        }
      }
    });
  }
}

}  // namespace tessera::cpu
