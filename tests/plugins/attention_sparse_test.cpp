// attention sparse: the block-sparse path against a naive masked reference (materialised scores in
// double), the dense fallbacks (short contexts, decode steps, keep_ratio 1), the backend's block
// scores against means computed here, and perplexity on the real model at context 512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "test_util.h"
#include "tessera/attention.h"
#include "tessera/eval.h"

namespace tessera {
namespace {

using KeyFilter = std::function<bool(int64_t pos, int64_t kv_head, int64_t key)>;

// One sequence in a paged pool (shuffled block table), prefilled in chunks through the plugin.
class SparseHarness {
 public:
  SparseHarness(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t len, uint64_t seed)
      : shape_{heads, kv_heads, head_dim, 0}, len_(len) {
    Backend& b = test::cpu_backend();
    const int64_t blocks = (len + kBlock - 1) / kBlock + 2;
    table_.resize(size_t(blocks));
    std::iota(table_.begin(), table_.end(), 0);
    std::shuffle(table_.begin(), table_.end(), std::mt19937(uint32_t(seed)));
    const size_t pool = size_t(blocks * kBlock * kv_heads * head_dim);
    k_pool_ = DeviceBuffer(b, pool * sizeof(float));
    v_pool_ = DeviceBuffer(b, pool * sizeof(float));
    q_ = test::random_floats(size_t(len * heads * head_dim), seed + 1, -2, 2);
    k_ = test::random_floats(size_t(len * kv_heads * head_dim), seed + 2, -2, 2);
    v_ = test::random_floats(size_t(len * kv_heads * head_dim), seed + 3);
  }

  KvLayerView kv() const {
    return {k_pool_.get(), v_pool_.get(), DType::F32, int64_t(table_.size()), kBlock, shape_.n_kv_heads,
            shape_.head_dim};
  }

  // Runs the plugin over positions [0, len) in steps of the given sizes; returns every output row.
  // Steps from index `verify_from` on are marked as speculative verification passes.
  std::vector<float> run(Attention& att, const std::vector<int64_t>& chunks, size_t verify_from = SIZE_MAX) {
    att.configure(shape_);
    const int64_t q_row = shape_.n_heads * shape_.head_dim, kv_row = shape_.n_kv_heads * shape_.head_dim;
    std::vector<float> out(q_.size(), NAN);
    int64_t start = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int64_t n = chunks[c];
      const uint8_t verifies = c >= verify_from ? 1 : 0;
      std::vector<int32_t> slots;
      for (int64_t p = start; p < start + n; ++p) {
        slots.push_back(static_cast<int32_t>(table_[size_t(p / kBlock)] * kBlock + p % kBlock));
      }
      AttentionSeqDesc desc{0, int32_t(n), int32_t(start + n), 0};
      AttentionStep step;
      step.n_tokens = n;
      step.slots = slots.data();
      step.seqs = &desc;
      step.block_tables = table_.data();
      step.host_seqs = std::span<const AttentionSeqDesc>(&desc, 1);
      step.host_verifies = std::span<const uint8_t>(&verifies, 1);
      step.max_q_len = int32_t(n);
      step.max_context_len = int32_t(start + n);
      att.forward(test::cpu_backend(), step, kv(), q_.data() + start * q_row, k_.data() + start * kv_row,
                  v_.data() + start * kv_row, out.data() + start * q_row);
      start += n;
    }
    EXPECT_EQ(start, len_);
    return out;
  }

  // Causal attention in double over the keys `keep` allows.
  std::vector<float> reference(const KeyFilter& keep) const {
    const int64_t hd = shape_.head_dim, group = shape_.n_heads / shape_.n_kv_heads;
    std::vector<float> out(q_.size());
    for (int64_t pos = 0; pos < len_; ++pos) {
      for (int64_t h = 0; h < shape_.n_heads; ++h) {
        const float* q = q_.data() + (pos * shape_.n_heads + h) * hd;
        const int64_t kvh = h / group;
        std::vector<double> s;
        std::vector<int64_t> keys;
        for (int64_t key = 0; key <= pos; ++key) {
          if (!keep(pos, kvh, key)) continue;
          const float* k = k_.data() + (key * shape_.n_kv_heads + kvh) * hd;
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += double(q[d]) * k[d];
          s.push_back(dot / std::sqrt(double(hd)));
          keys.push_back(key);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (size_t j = 0; j < keys.size(); ++j) {
            acc += s[j] * v_[size_t((keys[j] * shape_.n_kv_heads + kvh) * hd + d)];
          }
          out[size_t((pos * shape_.n_heads + h) * hd + d)] = float(acc / sum);
        }
      }
    }
    return out;
  }

  const std::vector<float>& q() const { return q_; }
  const std::vector<float>& k() const { return k_; }

  static constexpr int64_t kBlock = 16;  // KV cache block (unrelated to the sparse block)

 private:
  AttentionShape shape_;
  int64_t len_;
  std::vector<int32_t> table_;
  DeviceBuffer k_pool_, v_pool_;
  std::vector<float> q_, k_, v_;
};

std::shared_ptr<Attention> make(const nlohmann::json& params) {
  return test::plugins().create<Attention>("sparse", params, "test");
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "at " << i;
}

struct Heads {
  int64_t heads, kv_heads;
};

class SparseHeads : public testing::TestWithParam<Heads> {};

// keep_ratio 0, no local window: each query block sees exactly the sink block and its own block.
TEST_P(SparseHeads, KeepsTheSinkAndOwnBlockOnlyAcrossChunks) {
  const auto [heads, kv_heads] = GetParam();
  SparseHarness h(heads, kv_heads, 16, 203, 7);
  auto att = make({{"block_size", 32}, {"sink_blocks", 1}, {"local_window", 0}, {"keep_ratio", 0.0},
                   {"min_context", 0}});
  // The second chunk starts mid-block, so query blocks are counted from a partial block.
  const auto got = h.run(*att, {77, 126});
  expect_close(got, h.reference([](int64_t pos, int64_t, int64_t key) { return key < 32 || key / 32 == pos / 32; }), 2e-5f);
}

TEST_P(SparseHeads, KeepRatioOneEqualsDense) {
  const auto [heads, kv_heads] = GetParam();
  SparseHarness h(heads, kv_heads, 8, 150, 11);
  auto att = make({{"block_size", 16}, {"sink_blocks", 0}, {"local_window", 0}, {"keep_ratio", 1.0},
                   {"min_context", 0}});
  expect_close(h.run(*att, {150}), h.reference([](int64_t, int64_t, int64_t) { return true; }), 2e-5f);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SparseHeads, testing::Values(Heads{8, 8}, Heads{8, 4}, Heads{8, 1}),
                         [](const auto& info) {
                           return std::to_string(info.param.heads) + "x" + std::to_string(info.param.kv_heads);
                         });

TEST(AttentionSparse, TopKKeepsTheBestScoringBlocks) {
  // One prefill of 96 tokens in blocks of 16: each query block keeps its own block plus the one
  // earlier block whose mean key scores best against its mean query (per kv head), found here.
  const int64_t heads = 4, kv_heads = 2, hd = 8, len = 96, block = 16, group = heads / kv_heads;
  SparseHarness h(heads, kv_heads, hd, len, 3);
  auto att = make({{"block_size", block}, {"sink_blocks", 0}, {"local_window", 0}, {"top_k", 1}, {"min_context", 0}});
  auto mean = [&](const std::vector<float>& x, int64_t row_heads, int64_t first_head, int64_t n_heads, int64_t b) {
    std::vector<double> m(size_t(hd), 0.0);
    for (int64_t p = b * block; p < (b + 1) * block; ++p) {
      for (int64_t g = first_head; g < first_head + n_heads; ++g) {
        for (int64_t d = 0; d < hd; ++d) m[size_t(d)] += x[size_t((p * row_heads + g) * hd + d)];
      }
    }
    return m;
  };
  std::vector<std::vector<int64_t>> best(size_t(kv_heads), std::vector<int64_t>(size_t(len / block), -1));
  for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
    for (int64_t qb = 1; qb < len / block; ++qb) {
      const auto qm = mean(h.q(), heads, kvh * group, group, qb);
      double top = -INFINITY;
      for (int64_t kb = 0; kb < qb; ++kb) {
        const auto km = mean(h.k(), kv_heads, kvh, 1, kb);
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d) dot += qm[size_t(d)] * km[size_t(d)];
        if (dot > top) top = dot, best[size_t(kvh)][size_t(qb)] = kb;
      }
    }
  }
  const auto got = h.run(*att, {len});
  expect_close(got, h.reference([&](int64_t pos, int64_t kvh, int64_t key) {
                 return key / block == pos / block || key / block == best[size_t(kvh)][size_t(pos / block)];
               }),
               2e-5f);
}

TEST(AttentionSparse, ShortContextsAndDecodeStepsStayDense) {
  SparseHarness h(8, 2, 16, 140, 5);
  // min_context above the whole sequence: the first chunk is dense, and every later step is one
  // token (decode), which stays dense even though the context passes min_context.
  auto att = make({{"block_size", 16}, {"sink_blocks", 0}, {"local_window", 0}, {"keep_ratio", 0.0},
                   {"min_context", 136}});
  std::vector<int64_t> chunks{135};
  for (int i = 0; i < 5; ++i) chunks.push_back(1);
  expect_close(h.run(*att, chunks), h.reference([](int64_t, int64_t, int64_t) { return true; }), 2e-5f);
}

TEST(AttentionSparse, VerificationPassesStayDense) {
  // Speculative decoding verifies its drafts in passes of several tokens: each output must be a
  // decode step's (dense), or greedy speculation would not reproduce the plain decode. A prefill
  // chunk of the same shape still goes sparse.
  SparseHarness h(8, 2, 16, 140, 9);
  const nlohmann::json params = {{"block_size", 16}, {"sink_blocks", 0}, {"local_window", 0}, {"keep_ratio", 0.0},
                                 {"min_context", 0}};
  auto att = make(params);
  const auto dense = h.reference([](int64_t, int64_t, int64_t) { return true; });
  const auto verified = h.run(*att, {40, 100}, 0);
  expect_close(verified, dense, 2e-5f);
  const auto prefilled = h.run(*make(params), {40, 100});
  float largest = 0;
  for (size_t i = 0; i < prefilled.size(); ++i) largest = std::max(largest, std::abs(prefilled[i] - dense[i]));
  EXPECT_GT(largest, 1e-2f) << "the same chunks as a prefill are sparse";
}

TEST(AttentionSparse, RefusesBadParameters) {
  for (const auto& [params, field] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"block_size", 0}}, "block_size"},
           {{{"keep_ratio", 1.5}}, "keep_ratio"},
           {{{"top_k", -1}}, "top_k"},
           {{{"sink_blocks", -2}}, "sink_blocks"},
           {{{"min_context", -1}}, "min_context"}}) {
    try {
      make(params);
      ADD_FAILURE() << "accepted " << params.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

TEST(AttentionSparse, BlockScoresAreMeanQueryDotMeanKey) {
  Backend& b = test::cpu_backend();
  const int64_t heads = 4, kv_heads = 2, hd = 8, block = 8, kvb = 4, len = 37, first = 13;
  const int64_t group = heads / kv_heads;
  auto q = test::random_floats(size_t((len - first) * heads * hd), 21);
  auto k = test::random_floats(size_t(len * kv_heads * hd), 22);
  std::vector<int32_t> table{3, 0, 7, 1, 5, 2, 9, 4, 6, 8};
  std::vector<float> kpool(size_t(10 * kvb * kv_heads * hd), NAN);
  for (int64_t p = 0; p < len; ++p) {
    std::copy_n(k.data() + p * kv_heads * hd, kv_heads * hd,
                kpool.data() + (table[size_t(p / kvb)] * kvb + p % kvb) * kv_heads * hd);
  }
  KvLayerView kv{kpool.data(), kpool.data(), DType::F32, 10, kvb, kv_heads, hd};
  AttentionSeqDesc desc{0, int32_t(len - first), int32_t(len), 0};
  const int32_t base = 0;
  AttentionArgs a;
  a.q = q.data();
  a.n_tokens = len - first;
  a.n_heads = heads;
  a.scale = 0.5f;
  a.seqs = &desc;
  a.n_seqs = 1;
  a.block_tables = table.data();
  a.max_q_len = desc.q_len;
  a.max_context_len = desc.context_len;
  a.sparse.block = block;
  a.sparse.seq_base = &base;
  const int64_t n_kb = (len + block - 1) / block, first_qb = first / block, n_qb = (len - 1) / block - first_qb + 1;
  std::vector<float> scores(size_t(kv_heads * n_qb * n_kb), NAN);
  b.attention_block_scores(a, kv, scores.data());
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t qb = 0; qb < n_qb; ++qb) {
      std::vector<double> qm(size_t(hd), 0.0);
      const int64_t lo = std::max(first, (first_qb + qb) * block), hi = std::min(len, (first_qb + qb + 1) * block);
      for (int64_t p = lo; p < hi; ++p) {
        for (int64_t g = 0; g < group; ++g) {
          for (int64_t d = 0; d < hd; ++d) qm[size_t(d)] += q[size_t(((p - first) * heads + h * group + g) * hd + d)];
        }
      }
      for (int64_t kb = 0; kb <= first_qb + qb; ++kb) {
        std::vector<double> km(size_t(hd), 0.0);
        const int64_t kend = std::min(len, (kb + 1) * block);
        for (int64_t p = kb * block; p < kend; ++p) {
          for (int64_t d = 0; d < hd; ++d) km[size_t(d)] += k[size_t((p * kv_heads + h) * hd + d)];
        }
        double dot = 0;
        for (int64_t d = 0; d < hd; ++d) dot += qm[size_t(d)] * km[size_t(d)];
        dot /= double((hi - lo) * group) * double(kend - kb * block);
        EXPECT_NEAR(scores[size_t((h * n_qb + qb) * n_kb + kb)], 0.5 * dot, 1e-4) << h << " " << qb << " " << kb;
      }
    }
  }
}

// The accuracy bar: at context 512 with keep_ratio 0.5, perplexity within +3% of dense.
TEST(AttentionSparse, PerplexityAtContext512WithinThreePercentOfDense) {
  const std::string text = test::read_text(test::kShared + "/eval/tiny_stories_eval.txt");
  auto dense = test::cpu_pipeline(test::kStoriesF32);
  auto sparse = test::cpu_pipeline(
      test::kStoriesF32, {{"attention", {{"plugin", "sparse"}, {"block_size", 32}, {"sink_blocks", 1},
                                         {"local_window", 64}, {"keep_ratio", 0.5}, {"min_context", 128}}}});
  const auto tokens = dense->tokenizer().encode(text, true);
  const double d = perplexity(*dense, tokens, 512).perplexity;
  const double s = perplexity(*sparse, tokens, 512).perplexity;
  std::cout << "perplexity at 512: dense " << d << ", sparse keep 0.5 " << s << " (" << 100.0 * (s / d - 1) << "%)\n";
  EXPECT_NE(d, s);  // the sparse path really ran
  EXPECT_LT(s, d * 1.03);
}

}  // namespace
}  // namespace tessera
