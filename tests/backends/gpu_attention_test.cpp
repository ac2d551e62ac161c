// Paged attention and KV writes of the CUDA and HIP backends against the CPU backend: ragged GQA
// batches over shuffled block tables in every cache type, long decodes and prefills, block-sparse
// layouts and their block scores, bad slots and head sizes refused. Without a device every test
// skips with the backend's own refusal as the message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "tessera/dtype.h"

namespace tessera {
namespace {

using namespace gpu_test;  // NOLINT: the fixture and helpers of this test binary

class GpuAttention : public GpuOps {};

// ---- kv_write + attention ------------------------------------------------------------------------------

struct AttnSetup {
  int64_t n_heads, n_kv_heads, head_dim, block_size, window;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (q_len, context_len)
};

// Builds one ragged step over a shuffled paged pool, writes the history and this step's K/V with
// kv_write, and runs attention (dense or with a random block-sparse layout) on `b`. The cache of
// type kv_dtype on the device; the CPU reference gets an f32 cache holding the same rounded values.
struct AttnRun {
  std::vector<float> out, cache_k, scores;
};

class AttnCase {
 public:
  AttnCase(const AttnSetup& s, std::mt19937_64& rng, int64_t sparse_block) : s_(s), sparse_block_(sparse_block) {
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t kv_row = s.n_kv_heads * s.head_dim, q_row = s.n_heads * s.head_dim;
    int64_t blocks = 0;
    for (auto [q, ctx] : s.seqs) blocks += (ctx + s.block_size - 1) / s.block_size;
    num_blocks_ = blocks + 2;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks_));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    int32_t q_start = 0;
    for (size_t si = 0; si < s.seqs.size(); ++si) {
      const auto [q_len, ctx] = s.seqs[si];
      descs_.push_back({q_start, q_len, ctx, int32_t(tables_.size())});
      for (int64_t b = 0; b < (ctx + s.block_size - 1) / s.block_size; ++b) tables_.push_back(ids[next++]);
      for (int32_t t = 0; t < ctx; ++t) {
        slots_.push_back(tables_[size_t(descs_.back().block_table_offset + t / s.block_size)] * int32_t(s.block_size) +
                         t % int32_t(s.block_size));
        for (int64_t e = 0; e < kv_row; ++e) {
          k_.push_back(u(rng));
          v_.push_back(u(rng));
        }
      }
      for (int64_t e = 0; e < q_len * q_row; ++e) q_.push_back(u(rng));
      q_start += q_len;
      max_q_ = std::max(max_q_, q_len);
      max_ctx_ = std::max(max_ctx_, ctx);
    }
    n_tokens_ = q_start;
    if (sparse_block_ > 0) {
      // Every other sequence sparse; random kept blocks per (kv head, query block), always keeping the
      // query's own block so every row has keys.
      int32_t entries = 0;
      offsets_.push_back(0);
      for (auto [q_len, ctx] : s.seqs) {
        const bool sp = seq_base_.size() % 2 == 0 && q_len > 1;
        if (!sp) {
          seq_base_.push_back(-1);
          continue;
        }
        seq_base_.push_back(entries);
        const int64_t first_qb = (ctx - q_len) / sparse_block_, last_qb = (ctx - 1) / sparse_block_;
        for (int64_t h = 0; h < s.n_kv_heads; ++h) {
          for (int64_t qb = first_qb; qb <= last_qb; ++qb) {
            for (int64_t kb = 0; kb <= qb; ++kb) {
              if (kb == qb || std::uniform_int_distribution<int>(0, 2)(rng) == 0) kept_.push_back(int32_t(kb));
            }
            offsets_.push_back(int32_t(kept_.size()));
            ++entries;
          }
        }
      }
      entries_ = entries;
    }
  }

  // Float values as a cache of type t stores them.
  static std::vector<float> rounded(const std::vector<float>& v, DType t) {
    std::vector<float> out(v);
    for (float& x : out) x = t == DType::F16 ? fp16_to_f32(f32_to_fp16(x)) : t == DType::BF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
    return out;
  }

  AttnRun run(Backend& b, DType cache, bool cache_rounded_in_f32) {
    const int64_t kv_row = s_.n_kv_heads * s_.head_dim, q_row = s_.n_heads * s_.head_dim;
    const size_t elem = cache == DType::F32 ? 4 : 2;
    const size_t pool = size_t(num_blocks_ * s_.block_size * kv_row);
    auto upv = [&](const auto& v) {
      DeviceBuffer buf(b, std::max<size_t>(1, v.size() * sizeof(v[0])));
      if (!v.empty()) b.copy_to_device(buf.get(), v.data(), v.size() * sizeof(v[0]));
      return buf;
    };
    DeviceBuffer kp = upv(std::vector<uint8_t>(pool * elem, 0xFF)), vp = upv(std::vector<uint8_t>(pool * elem, 0xFF));
    KvLayerView kv{kp.get(), vp.get(), cache, num_blocks_, s_.block_size, s_.n_kv_heads, s_.head_dim};
    const auto ks = cache_rounded_in_f32 ? rounded(k_, rounding_) : k_;
    const auto vs = cache_rounded_in_f32 ? rounded(v_, rounding_) : v_;
    DeviceBuffer kd = upv(ks), vd = upv(vs), sd = upv(slots_);
    b.kv_write(kv, kd.as<float>(), vd.as<float>(), sd.as<int32_t>(), int64_t(slots_.size()));
    DeviceBuffer qd = upv(q_), dd = upv(descs_), td = upv(tables_);
    DeviceBuffer od = upv(std::vector<float>(size_t(n_tokens_ * q_row) + kGuard, std::nanf("")));
    DeviceBuffer bd = upv(seq_base_), fd = upv(offsets_), ed = upv(kept_);
    AttentionArgs a;
    a.q = qd.as<float>();
    a.out = od.as<float>();
    a.n_tokens = n_tokens_;
    a.n_heads = s_.n_heads;
    a.scale = 1.0f / std::sqrt(float(s_.head_dim));
    a.window = s_.window;
    a.seqs = dd.as<AttentionSeqDesc>();
    a.n_seqs = int64_t(descs_.size());
    a.block_tables = td.as<int32_t>();
    a.max_q_len = max_q_;
    a.max_context_len = max_ctx_;
    AttnRun r;
    if (sparse_block_ > 0) {
      a.sparse = BlockSparseLayout{sparse_block_, bd.as<int32_t>(), fd.as<int32_t>(), ed.as<int32_t>()};
      const int64_t n_kb = (max_ctx_ + sparse_block_ - 1) / sparse_block_;
      const size_t n_scores = size_t(entries_ * n_kb);
      DeviceBuffer scd = upv(std::vector<float>(n_scores + kGuard, std::nanf("")));
      b.attention_block_scores(a, kv, scd.as<float>());
      b.synchronize();
      r.scores.resize(n_scores + kGuard);
      b.copy_to_host(r.scores.data(), scd.get(), r.scores.size() * 4);
    }
    b.attention(a, kv);
    b.synchronize();
    r.out.resize(size_t(n_tokens_ * q_row) + kGuard);
    b.copy_to_host(r.out.data(), od.get(), r.out.size() * 4);
    std::vector<uint8_t> raw(pool * elem);
    b.copy_to_host(raw.data(), kp.get(), raw.size());
    r.cache_k.resize(pool);
    for (size_t i = 0; i < pool; ++i) {
      if (elem == 4) {
        std::memcpy(&r.cache_k[i], raw.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, raw.data() + 2 * i, 2);
        r.cache_k[i] = cache == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
    }
    return r;
  }

  void set_rounding(DType t) { rounding_ = t; }

 private:
  AttnSetup s_;
  int64_t sparse_block_;
  int64_t num_blocks_ = 0, n_tokens_ = 0, entries_ = 0;
  int32_t max_q_ = 0, max_ctx_ = 0;
  DType rounding_ = DType::F32;
  std::vector<AttentionSeqDesc> descs_;
  std::vector<int32_t> tables_, slots_, seq_base_, offsets_, kept_;
  std::vector<float> q_, k_, v_;
};

TEST_P(GpuAttention, KvWriteAndPagedAttentionMatchCpu) {
  SCOPED_TRACE(seed_note());
  int n = 0;
  for (DType cache : {DType::F32, DType::F16, DType::BF16}) {
    ASSERT_TRUE(gpu().supports(Op::attention, cache) && gpu().supports(Op::kv_write, cache));
    for (int64_t head_dim : {16, 64, 128, 256}) {
      for (int64_t n_kv : {1, 2, 8}) {
        const int64_t n_heads = 8;
        AttnSetup s{n_heads, n_kv, head_dim, pick(1, 32), pick(0, 1) ? 0 : pick(1, 100), {}};
        // Decodes, a fresh prefill, a chunk continuing a prefix, one long context (several chunks).
        s.seqs = {{1, int32_t(pick(1, 300))}, {int32_t(pick(2, 40)), 0}, {int32_t(pick(2, 20)), 0}, {1, 1}};
        s.seqs[1].second = s.seqs[1].first;
        s.seqs[2].second = s.seqs[2].first + int32_t(pick(0, 200));
        SCOPED_TRACE(std::string(dtype_name(cache)) + " head_dim " + std::to_string(head_dim) + " kv heads " +
                     std::to_string(n_kv) + " block " + std::to_string(s.block_size) + " window " +
                     std::to_string(s.window));
        AttnCase c(s, rng_, 0);
        c.set_rounding(cache);
        const AttnRun got = c.run(gpu(), cache, false);
        const AttnRun want = c.run(cpu(), DType::F32, true);  // the CPU sees the values the cache holds
        for (size_t i = want.out.size() - kGuard; i < want.out.size(); ++i) {
          ASSERT_TRUE(std::isnan(got.out[i])) << "attention wrote past its output";
        }
        // Stored K equals the CPU's (rounded) copy, and untouched slots stay poisoned on both.
        EXPECT_EQ(got.cache_k.size(), want.cache_k.size());
        size_t diff = 0;
        for (size_t i = 0; i < got.cache_k.size(); ++i) {
          diff += !(got.cache_k[i] == want.cache_k[i] || (std::isnan(got.cache_k[i]) && std::isnan(want.cache_k[i])));
        }
        EXPECT_EQ(diff, 0u) << "kv_write stored different values";
        // Both sides compute in f32 over the same (cache-rounded) values, which lie in [-1, 1]; a
        // kernel that rounded q or the probabilities to the cache type would need ~1e-3 here.
        const double tol = 2e-5;
        std::vector<float> g(got.out.begin(), got.out.end() - kGuard), w(want.out.begin(), want.out.end() - kGuard);
        EXPECT_TRUE(close(g, w, [&](size_t) { return tol; }));
        ++n;
      }
    }
  }
  EXPECT_GT(n, 0);
}

// Long contexts: a lone decode row (whose keys the GPU splits over several blocks and merges) and a
// long prefill chunk (many row tiles, each walking many key chunks), with and without a window.
TEST_P(GpuAttention, LongDecodeAndLongPrefillAttentionMatchCpu) {
  SCOPED_TRACE(seed_note());
  for (DType cache : {DType::F32, DType::F16}) {
    for (int64_t head_dim : {64, 128}) {
      for (int64_t window : {int64_t(0), pick(100, 600)}) {
        const int32_t ctx = int32_t(pick(700, 3000)), chunk = int32_t(pick(100, 300));
        for (const auto& seqs : std::vector<std::vector<std::pair<int32_t, int32_t>>>{{{1, ctx}}, {{chunk, ctx}}}) {
          AttnSetup s{8, 2, head_dim, pick(8, 32), window, seqs};
          SCOPED_TRACE(std::string(dtype_name(cache)) + " head_dim " + std::to_string(head_dim) + " window " +
                       std::to_string(window) + " q_len " + std::to_string(seqs[0].first) + " context " +
                       std::to_string(ctx));
          AttnCase c(s, rng_, 0);
          c.set_rounding(cache);
          const AttnRun got = c.run(gpu(), cache, false);
          const AttnRun want = c.run(cpu(), DType::F32, true);
          for (size_t i = want.out.size() - kGuard; i < want.out.size(); ++i) {
            ASSERT_TRUE(std::isnan(got.out[i])) << "attention wrote past its output";
          }
          std::vector<float> g(got.out.begin(), got.out.end() - kGuard), w(want.out.begin(), want.out.end() - kGuard);
          EXPECT_TRUE(close(g, w, [](size_t) { return 2e-5; }));
        }
      }
    }
  }
}

TEST_P(GpuAttention, BlockSparseAttentionAndBlockScoresMatchCpu) {
  SCOPED_TRACE(seed_note());
  ASSERT_TRUE(gpu().supports(Op::sparse_attention, DType::F32));
  for (int64_t head_dim : {32, 64, 128}) {
    for (int64_t n_kv : {1, 4}) {
      const int64_t block = 8 * pick(1, 8);
      AttnSetup s{8, n_kv, head_dim, pick(4, 32), 0, {}};
      const int32_t long_q = int32_t(pick(20, 300));
      s.seqs = {{long_q, long_q + int32_t(pick(0, 200))}, {1, int32_t(pick(1, 100))}, {int32_t(pick(2, 50)), 0}};
      s.seqs[2].second = s.seqs[2].first + int32_t(pick(0, 70));
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " kv heads " + std::to_string(n_kv) + " sparse block " +
                   std::to_string(block));
      AttnCase c(s, rng_, block);
      const AttnRun got = c.run(gpu(), DType::F32, false);
      const AttnRun want = c.run(cpu(), DType::F32, false);
      std::vector<float> g(got.out.begin(), got.out.end() - kGuard), w(want.out.begin(), want.out.end() - kGuard);
      EXPECT_TRUE(close(g, w, [](size_t) { return 2e-5; })) << "attention";
      // Scores: entries the op must fill agree; entries it must leave (beyond the causal blocks)
      // stay poisoned on both.
      ASSERT_EQ(got.scores.size(), want.scores.size());
      size_t bad = 0;
      for (size_t i = 0; i < want.scores.size(); ++i) {
        const bool gn = std::isnan(got.scores[i]), wn = std::isnan(want.scores[i]);
        if (gn != wn || (!wn && std::fabs(got.scores[i] - want.scores[i]) > 1e-5 * (1 + std::fabs(want.scores[i])))) ++bad;
      }
      EXPECT_EQ(bad, 0u) << "block scores differ";
    }
  }
}

TEST_P(GpuAttention, OutOfRangeKvSlotIsReportedAtTheNextSync) {
  DeviceBuffer kp(gpu(), 4 * 8 * 4), vp(gpu(), 4 * 8 * 4);
  KvLayerView kv{kp.get(), vp.get(), DType::F32, 2, 2, 1, 8};
  DeviceBuffer rows = up(gpu(), std::vector<float>(16, 1.0f)), slots = up(gpu(), std::vector<int32_t>{0, 9});
  gpu().kv_write(kv, rows.as<float>(), rows.as<float>(), slots.as<int32_t>(), 2);
  try {
    gpu().synchronize();
    ADD_FAILURE() << "slot 9 of 4 should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv slot 9 is outside the cache (4 slots)"), std::string::npos) << e.what();
  }
}

TEST_P(GpuAttention, AttentionRefusesHeadSizesBeyondItsLimit) {
  DeviceBuffer b(gpu(), 64);
  KvLayerView kv{b.get(), b.get(), DType::F32, 1, 1, 1, 512};
  AttentionArgs a;
  a.n_heads = 1;
  try {
    gpu().attention(a, kv);
    ADD_FAILURE() << "head size 512 should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head size 512"), std::string::npos) << e.what();
  }
}

// ---- the real model ---------------------------------------------------------------------------------

INSTANTIATE_TEST_SUITE_P(Gpu, GpuAttention, testing::Values("cuda", "hip"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace tessera
