// Backend conformance, continued: kv_write and paged attention over a ragged GQA batch, against a
// naive reference (see backend_conformance_test.cpp for the suite's rules).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "conformance/backend_conformance.h"
#include "conformance/conformance_util.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

size_t elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// The value a cache of type t stores for x (round to nearest even, as every device converts).
float through_cache(DType t, float x) {
  switch (t) {
    case DType::F16: return fp16_to_f32(f32_to_fp16(x));
    case DType::BF16: return bf16_to_f32(f32_to_bf16(x));
    default: return x;
  }
}

std::vector<float> read_cache(Backend& b, const void* pool, DType t, size_t n) {
  std::vector<float> out(n);
  if (t == DType::F32) return download<float>(b, pool, n);
  const auto raw = download<uint16_t>(b, pool, n);
  for (size_t i = 0; i < n; ++i) out[i] = t == DType::F16 ? fp16_to_f32(raw[i]) : bf16_to_f32(raw[i]);
  return out;
}

struct AttnCase {
  int64_t n_kv_heads, head_dim, window, block_size;
  float softcap = 0;  // AttentionArgs::softcap (Gemma 2)
};

// One ragged step: (q_len, context_len) per sequence — a fresh prefill, decodes (one at the very
// first position, two past 64 and 128 keys, where kernels cut a context into segments or blocks)
// and prefill chunks continuing a cached prefix.
struct SeqShape {
  int32_t q_len, context_len;
};
const std::vector<SeqShape> kSeqs = {{9, 9}, {1, 23}, {5, 40}, {1, 1}, {1, 150}, {3, 200}};

void run_attention_case(Backend& b, DType kv_dtype, const AttnCase& c, uint64_t seed) {
  const int64_t n_heads = 8, hd = c.head_dim, nkv = c.n_kv_heads, bs = c.block_size;
  const int64_t kv_row = nkv * hd, q_row = n_heads * hd;
  std::mt19937_64 rng(seed);

  // Shuffled block tables over a pool with spare blocks that nobody uses (they stay poisoned).
  int64_t needed = 0;
  for (const SeqShape& s : kSeqs) needed += (s.context_len + bs - 1) / bs;
  const int64_t num_blocks = needed + 3;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  std::vector<AttentionSeqDesc> descs;
  std::vector<int32_t> tables;
  std::vector<std::vector<float>> k_all, v_all;  // per sequence [context][kv_row]
  std::vector<float> q, k_step, v_step;
  std::vector<int32_t> step_slots, hist_slots;
  std::vector<float> k_hist, v_hist;
  int32_t q_start = 0, max_q = 0, max_ctx = 0;
  size_t next_block = 0;
  for (size_t si = 0; si < kSeqs.size(); ++si) {
    const SeqShape& s = kSeqs[si];
    AttentionSeqDesc d{q_start, s.q_len, s.context_len, int32_t(tables.size())};
    descs.push_back(d);
    std::vector<int32_t> table;
    for (int64_t blk = 0; blk < (s.context_len + bs - 1) / bs; ++blk) table.push_back(ids[next_block++]);
    tables.insert(tables.end(), table.begin(), table.end());
    k_all.push_back(random_floats(size_t(s.context_len * kv_row), seed * 10 + si));
    v_all.push_back(random_floats(size_t(s.context_len * kv_row), seed * 10 + si + 5));
    const auto qs = random_floats(size_t(s.q_len * q_row), seed * 10 + si + 7);
    q.insert(q.end(), qs.begin(), qs.end());
    for (int32_t t = 0; t < s.context_len; ++t) {
      const int32_t slot = int32_t(table[size_t(t / bs)] * bs + t % bs);
      const bool in_step = t >= s.context_len - s.q_len;
      auto& ks = in_step ? k_step : k_hist;
      auto& vs = in_step ? v_step : v_hist;
      ks.insert(ks.end(), k_all[si].begin() + t * kv_row, k_all[si].begin() + (t + 1) * kv_row);
      vs.insert(vs.end(), v_all[si].begin() + t * kv_row, v_all[si].begin() + (t + 1) * kv_row);
      (in_step ? step_slots : hist_slots).push_back(slot);
    }
    q_start += s.q_len;
    max_q = std::max(max_q, s.q_len);
    max_ctx = std::max(max_ctx, s.context_len);
  }
  const int64_t n_tokens = q_start;

  // The pool is poisoned with 0xFF bytes (NaN in f32, f16 and bf16), as fresh device memory may
  // be: slots outside a sequence's context must not influence its output (0 * NaN is NaN, so a
  // masked-but-read value still fails), and kv_write must touch only the slots it is given.
  const size_t pool_elems = size_t(num_blocks * bs * kv_row);
  const std::vector<uint8_t> ff(pool_elems * elem_bytes(kv_dtype), 0xFF);
  DeviceBuffer kpool = upload(b, ff), vpool = upload(b, ff);
  KvLayerView kv{kpool.get(), vpool.get(), kv_dtype, num_blocks, bs, nkv, hd};

  // History first (as earlier steps would have written it, rows in shuffled order), then this step.
  {
    std::vector<size_t> order(hist_slots.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> slots;
    std::vector<float> ks, vs;
    for (size_t i : order) {
      slots.push_back(hist_slots[i]);
      ks.insert(ks.end(), k_hist.begin() + long(i) * kv_row, k_hist.begin() + long(i + 1) * kv_row);
      vs.insert(vs.end(), v_hist.begin() + long(i) * kv_row, v_hist.begin() + long(i + 1) * kv_row);
    }
    DeviceBuffer sb = upload(b, slots), kb = upload(b, ks), vb = upload(b, vs);
    b.kv_write(kv, kb.as<float>(), vb.as<float>(), sb.as<int32_t>(), int64_t(slots.size()));
  }
  DeviceBuffer sb = upload(b, step_slots), kb = upload(b, k_step), vb = upload(b, v_step);
  b.kv_write(kv, kb.as<float>(), vb.as<float>(), sb.as<int32_t>(), int64_t(step_slots.size()));
  b.synchronize();

  // Every token's K/V sits at its slot; every other slot is untouched.
  {
    const auto kc = read_cache(b, kpool.get(), kv_dtype, pool_elems);
    const auto vc = read_cache(b, vpool.get(), kv_dtype, pool_elems);
    std::vector<bool> used(size_t(num_blocks * bs), false);
    size_t mismatches = 0;
    for (size_t si = 0; si < kSeqs.size(); ++si) {
      const int32_t* table = tables.data() + descs[si].block_table_offset;
      for (int32_t t = 0; t < kSeqs[si].context_len; ++t) {
        const int64_t slot = int64_t(table[t / bs]) * bs + t % bs;
        used[size_t(slot)] = true;
        for (int64_t e = 0; e < kv_row; ++e) {
          mismatches += kc[size_t(slot * kv_row + e)] != through_cache(kv_dtype, k_all[si][size_t(t * kv_row + e)]);
          mismatches += vc[size_t(slot * kv_row + e)] != through_cache(kv_dtype, v_all[si][size_t(t * kv_row + e)]);
        }
      }
    }
    EXPECT_EQ(mismatches, 0u) << "kv_write stored wrong values";
    size_t touched = 0;
    for (int64_t slot = 0; slot < num_blocks * bs; ++slot) {
      if (used[size_t(slot)]) continue;
      for (int64_t e = 0; e < kv_row; ++e) {
        touched += !std::isnan(kc[size_t(slot * kv_row + e)]) || !std::isnan(vc[size_t(slot * kv_row + e)]);
      }
    }
    EXPECT_EQ(touched, 0u) << "kv_write wrote outside the given slots";
  }

  // Reference: materialised scores in double over the cache-rounded K/V, causal, windowed.
  const double scale = 1.0 / std::sqrt(double(hd));
  const int64_t group = n_heads / nkv;
  std::vector<double> want(size_t(n_tokens * q_row));
  for (size_t si = 0; si < kSeqs.size(); ++si) {
    const SeqShape& s = kSeqs[si];
    for (int32_t qi = 0; qi < s.q_len; ++qi) {
      const int64_t pos = s.context_len - s.q_len + qi;
      const int64_t lo = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
      const int64_t row = descs[si].q_start + qi;
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t kh = h / group;
        std::vector<double> p;
        double mx = -INFINITY;
        for (int64_t key = lo; key <= pos; ++key) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += double(q[size_t(row * q_row + h * hd + d)]) *
                   through_cache(kv_dtype, k_all[si][size_t(key * kv_row + kh * hd + d)]);
          }
          p.push_back(c.softcap > 0 ? c.softcap * std::tanh(dot * scale / c.softcap) : dot * scale);
          mx = std::max(mx, p.back());
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t key = lo; key <= pos; ++key) {
            acc += p[size_t(key - lo)] * through_cache(kv_dtype, v_all[si][size_t(key * kv_row + kh * hd + d)]);
          }
          want[size_t(row * q_row + h * hd + d)] = acc / sum;
        }
      }
    }
  }

  DeviceBuffer qb = upload(b, q), db = upload(b, descs), tb = upload(b, tables);
  DeviceBuffer ob = poisoned_floats(b, want.size() + kGuard);
  AttentionArgs args;
  args.q = qb.as<float>();
  args.out = ob.as<float>();
  args.n_tokens = n_tokens;
  args.n_heads = n_heads;
  args.scale = float(scale);
  args.softcap = c.softcap;
  args.window = c.window;
  args.seqs = db.as<AttentionSeqDesc>();
  args.n_seqs = int64_t(descs.size());
  args.block_tables = tb.as<int32_t>();
  args.max_q_len = max_q;
  args.max_context_len = max_ctx;
  b.attention(args, kv);
  b.synchronize();
  auto got = download<float>(b, ob.get(), want.size() + kGuard);
  EXPECT_TRUE(all_nan(std::span<const float>(got).subspan(want.size()))) << "attention wrote past its output";
  got.resize(want.size());
  // Outputs are convex combinations of values in [-1, 1]. f32: float softmax and dots (~1e-6).
  // f16/bf16 caches: a device may also round q and the probabilities to the cache type.
  const double tol = kv_dtype == DType::F32 ? 1e-4 : kv_dtype == DType::F16 ? 5e-3 : 3e-2;
  EXPECT_TRUE(all_close(got, want, [&](size_t) { return tol; }));
}

TEST_P(BackendConformance, KvWriteAndPagedAttentionOverRaggedGqaBatch) {
  int ran = 0;
  for (DType kv_dtype : {DType::F32, DType::F16, DType::BF16}) {
    // Only f32 is required of the cpu reference; half-precision caches run where a backend claims them.
    const bool ok = kv_dtype == DType::F32
                        ? claims(Op::kv_write, kv_dtype) && claims(Op::attention, kv_dtype)
                        : b().supports(Op::kv_write, kv_dtype) && b().supports(Op::attention, kv_dtype);
    if (!ok) continue;
    uint64_t seed = 9000;
    for (int64_t n_kv_heads : {8, 4, 2, 1}) {  // n_heads 8: MHA, GQA 2 and 4, MQA
      for (int64_t head_dim : {8, 64}) {
        for (int64_t window : {0, 6}) {
          for (int64_t block_size : {16, 5}) {
            const AttnCase c{n_kv_heads, head_dim, window, block_size};
            SCOPED_TRACE(std::string("kv ") + std::string(dtype_name(kv_dtype)) + " n_kv_heads " +
                         std::to_string(n_kv_heads) + " head_dim " + std::to_string(head_dim) + " window " +
                         std::to_string(window) + " block_size " + std::to_string(block_size));
            run_attention_case(b(), kv_dtype, c, ++seed);
            ++ran;
          }
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "backend claims no kv cache type for attention";
}

TEST_P(BackendConformance, PagedAttentionSoftCapsTheScores) {
  // Scores capped at 0.25 (below what these q and k give) change every output, prefill and decode,
  // windowed or not: the cap must apply to the scaled scores before the softmax.
  if (!claims(Op::attention, DType::F32) || !claims(Op::kv_write, DType::F32)) GTEST_SKIP() << "attention not supported";
  uint64_t seed = 9500;
  for (int64_t n_kv_heads : {8, 2}) {
    for (int64_t window : {0, 6}) {
      SCOPED_TRACE("n_kv_heads " + std::to_string(n_kv_heads) + " window " + std::to_string(window));
      run_attention_case(b(), DType::F32, AttnCase{n_kv_heads, 64, window, 16, 0.25f}, ++seed);
    }
  }
}

}  // namespace
}  // namespace tessera
