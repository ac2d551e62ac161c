// Attention conformance: every attention plugin the loader finds, configured with several head
// layouts, runs two engine-like steps on the CPU backend over a KV layout allocated here (shuffled
// block tables, NaN-poisoned pool): first a ragged prefill of three sequences, then a step that
// prefills a fourth while the others decode at different positions. Outputs are compared with a
// naive reference (materialised scores in double, causal mask, sliding window), and the K/V rows
// must land in exactly the slots the step names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/attention.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

class AttentionConformance : public testing::TestWithParam<std::string> {};

TEST(AttentionPlugins, AtLeastOneIsLoaded) {
  EXPECT_FALSE(plugin_names(ComponentKind::attention).empty())
      << "no attention plugin in " << plugin_source() << "\n" << load_failures();
}

// One sequence's whole history: K/V/Q rows for every position it will ever have.
struct Seq {
  std::vector<int32_t> table;
  std::vector<float> q, k, v;  // [positions][row]
};

struct Step {
  struct Part {
    size_t seq;
    int32_t start;  // first position computed this step
    int32_t len;
  };
  std::vector<Part> parts;
};

class Harness {
 public:
  Harness(Backend& b, const AttentionShape& shape, int64_t block_size, uint64_t seed)
      : b_(b), shape_(shape), bs_(block_size), rng_(seed), seed_(seed) {}

  // Allocates a pool with spare blocks and gives each sequence a shuffled table for `max_len`.
  void add_sequences(const std::vector<int32_t>& max_lens) {
    int64_t blocks = 3;
    for (int32_t n : max_lens) blocks += (n + bs_ - 1) / bs_;
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    size_t next = 0;
    const int64_t kv_row = shape_.n_kv_heads * shape_.head_dim, q_row = shape_.n_heads * shape_.head_dim;
    for (size_t i = 0; i < max_lens.size(); ++i) {
      Seq s;
      for (int64_t j = 0; j < (max_lens[i] + bs_ - 1) / bs_; ++j) s.table.push_back(ids[next++]);
      s.q = random_floats(size_t(max_lens[i] * q_row), seed_ * 31 + i * 3);
      s.k = random_floats(size_t(max_lens[i] * kv_row), seed_ * 31 + i * 3 + 1);
      s.v = random_floats(size_t(max_lens[i] * kv_row), seed_ * 31 + i * 3 + 2);
      seqs_.push_back(std::move(s));
    }
    num_blocks_ = blocks;
    pool_elems_ = size_t(blocks * bs_ * kv_row);
    kpool_ = poisoned_floats(b_, pool_elems_);
    vpool_ = poisoned_floats(b_, pool_elems_);
  }

  KvLayerView view() const {
    return {kpool_.get(), vpool_.get(), DType::F32, num_blocks_, bs_, shape_.n_kv_heads, shape_.head_dim};
  }

  int64_t slot(size_t seq, int64_t pos) const { return int64_t(seqs_[seq].table[size_t(pos / bs_)]) * bs_ + pos % bs_; }

  // Runs one step through the plugin and checks its output and the cache against the reference.
  void run(Attention& attn, const Step& step) {
    const int64_t hd = shape_.head_dim, kv_row = shape_.n_kv_heads * hd, q_row = shape_.n_heads * hd;
    std::vector<float> q, k, v;
    std::vector<int32_t> slots, tables;
    std::vector<AttentionSeqDesc> descs;
    int32_t n = 0, max_q = 0, max_ctx = 0;
    for (const Step::Part& p : step.parts) {
      const Seq& s = seqs_[p.seq];
      descs.push_back({n, p.len, p.start + p.len, int32_t(tables.size())});
      tables.insert(tables.end(), s.table.begin(), s.table.end());
      q.insert(q.end(), s.q.begin() + p.start * q_row, s.q.begin() + (p.start + p.len) * q_row);
      k.insert(k.end(), s.k.begin() + p.start * kv_row, s.k.begin() + (p.start + p.len) * kv_row);
      v.insert(v.end(), s.v.begin() + p.start * kv_row, s.v.begin() + (p.start + p.len) * kv_row);
      for (int32_t t = p.start; t < p.start + p.len; ++t) slots.push_back(int32_t(slot(p.seq, t)));
      n += p.len;
      max_q = std::max(max_q, p.len);
      max_ctx = std::max(max_ctx, p.start + p.len);
      written_.push_back({p.seq, p.start + p.len});
    }
    DeviceBuffer qb = upload(b_, q), kb = upload(b_, k), vb = upload(b_, v), sb = upload(b_, slots);
    DeviceBuffer db = upload(b_, descs), tb = upload(b_, tables);
    DeviceBuffer ob = poisoned_floats(b_, size_t(n * q_row) + 16);
    AttentionStep as;
    as.n_tokens = n;
    as.slots = sb.as<int32_t>();
    as.seqs = db.as<AttentionSeqDesc>();
    as.block_tables = tb.as<int32_t>();
    as.host_seqs = descs;
    as.max_q_len = max_q;
    as.max_context_len = max_ctx;
    attn.forward(b_, as, view(), qb.as<float>(), kb.as<float>(), vb.as<float>(), ob.as<float>());
    b_.synchronize();

    // The reference reads K/V from the test's own arrays, not from the cache.
    const int64_t group = shape_.n_heads / shape_.n_kv_heads;
    const double scale = 1.0 / std::sqrt(double(hd));
    std::vector<double> want(size_t(n * q_row));
    int64_t row = 0;
    for (const Step::Part& p : step.parts) {
      const Seq& s = seqs_[p.seq];
      for (int32_t pos = p.start; pos < p.start + p.len; ++pos, ++row) {
        const int64_t lo = shape_.window > 0 ? std::max<int64_t>(0, pos - shape_.window + 1) : 0;
        for (int64_t h = 0; h < shape_.n_heads; ++h) {
          const int64_t kh = h / group;
          std::vector<double> scores;
          for (int64_t key = 0; key <= pos; ++key) {
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d) {
              dot += double(s.q[size_t(pos * q_row + h * hd + d)]) * s.k[size_t(key * kv_row + kh * hd + d)];
            }
            scores.push_back(key < lo ? -INFINITY : dot * scale);  // causal by construction, window by mask
          }
          const double mx = *std::max_element(scores.begin(), scores.end());
          double sum = 0;
          for (double& x : scores) sum += (x = std::exp(x - mx));
          for (int64_t d = 0; d < hd; ++d) {
            double acc = 0;
            for (int64_t key = 0; key <= pos; ++key) {
              acc += scores[size_t(key)] * s.v[size_t(key * kv_row + kh * hd + d)];
            }
            want[size_t(row * q_row + h * hd + d)] = acc / sum;
          }
        }
      }
    }
    auto got = download<float>(b_, ob.get(), want.size() + 16);
    EXPECT_TRUE(all_nan(std::span<const float>(got).subspan(want.size()))) << "attention wrote past its output";
    got.resize(want.size());
    EXPECT_TRUE(all_close(got, want, [](size_t) { return 1e-4; }));  // convex mix of values in [-1, 1]
    check_cache();
  }

  // Every position written so far holds its K/V at its slot; no other slot was touched.
  void check_cache() {
    const int64_t kv_row = shape_.n_kv_heads * shape_.head_dim;
    const auto kc = download<float>(b_, kpool_.get(), pool_elems_), vc = download<float>(b_, vpool_.get(), pool_elems_);
    std::vector<int32_t> filled(seqs_.size(), 0);
    for (const auto& [seq, upto] : written_) filled[seq] = std::max(filled[seq], upto);
    std::vector<bool> used(size_t(num_blocks_ * bs_), false);
    size_t wrong = 0, stray = 0;
    for (size_t si = 0; si < seqs_.size(); ++si) {
      for (int64_t t = 0; t < filled[si]; ++t) {
        const int64_t sl = slot(si, t);
        used[size_t(sl)] = true;
        for (int64_t e = 0; e < kv_row; ++e) {
          wrong += kc[size_t(sl * kv_row + e)] != seqs_[si].k[size_t(t * kv_row + e)];
          wrong += vc[size_t(sl * kv_row + e)] != seqs_[si].v[size_t(t * kv_row + e)];
        }
      }
    }
    for (size_t sl = 0; sl < used.size(); ++sl) {
      if (used[sl]) continue;
      for (size_t e = sl * size_t(kv_row); e < (sl + 1) * size_t(kv_row); ++e) {
        stray += !std::isnan(kc[e]) || !std::isnan(vc[e]);
      }
    }
    EXPECT_EQ(wrong, 0u) << "K/V not stored at the slots the step gave";
    EXPECT_EQ(stray, 0u) << "K/V written to slots the step did not give";
  }

 private:
  Backend& b_;
  AttentionShape shape_;
  int64_t bs_;
  std::mt19937_64 rng_;
  uint64_t seed_;
  std::vector<Seq> seqs_;
  std::vector<std::pair<size_t, int32_t>> written_;
  int64_t num_blocks_ = 0;
  size_t pool_elems_ = 0;
  DeviceBuffer kpool_, vpool_;
};

TEST_P(AttentionConformance, RaggedPrefillAndDecodeMatchNaiveAttention) {
  // {n_heads, n_kv_heads, head_dim, window}: stories260K's layout, MHA, MQA, GQA with a window,
  // and an odd head count.
  const std::vector<AttentionShape> shapes = {{8, 4, 8, 0}, {4, 4, 16, 0}, {8, 1, 64, 0}, {8, 2, 32, 5}, {6, 3, 8, 0}};
  uint64_t seed = 100;
  for (const AttentionShape& shape : shapes) {
    for (int64_t block_size : {16, 3}) {
      SCOPED_TRACE("heads " + std::to_string(shape.n_heads) + "/" + std::to_string(shape.n_kv_heads) + " head_dim " +
                   std::to_string(shape.head_dim) + " window " + std::to_string(shape.window) + " block_size " +
                   std::to_string(block_size));
      auto attn = create_default<Attention>(GetParam());
      attn->configure(shape);
      for (const OpRequirement& r : attn->requirements(DType::F32)) {
        EXPECT_FALSE(r.who.empty());
        EXPECT_TRUE(cpu().supports(r.op, r.dtype)) << "requires " << op_name(r.op) << " which the cpu backend lacks";
      }
      Harness h(cpu(), shape, block_size, ++seed);
      // Sequence 4 is long: kernels that cut a long context into segments or blocks (past 64 and
      // 128 keys) are checked there too.
      h.add_sequences({20, 30, 14, 16, 170});
      // Step 1: ragged prefill of sequences 0..2 (the last one in two chunks) and 4.
      h.run(*attn, Step{{{0, 0, 17}, {1, 0, 26}, {2, 0, 5}, {4, 0, 150}}});
      // Step 2: sequence 3 prefills while the others decode (or continue their prefill).
      h.run(*attn, Step{{{3, 0, 13}, {0, 17, 1}, {1, 26, 1}, {2, 5, 7}, {4, 150, 1}}});
      // Step 3: pure decode at different positions, batch order changed.
      h.run(*attn, Step{{{2, 12, 1}, {1, 27, 1}, {4, 151, 1}, {3, 13, 1}, {0, 18, 1}}});
    }
  }
}

TEST_P(AttentionConformance, RejectsHeadCountsThatDoNotGroup) {
  auto attn = create_default<Attention>(GetParam());
  EXPECT_THROW(attn->configure({8, 3, 8, 0}), Error);
}

INSTANTIATE_TEST_SUITE_P(Attentions, AttentionConformance,
                         testing::ValuesIn(plugin_names(ComponentKind::attention)), param_name);

}  // namespace
}  // namespace tessera
