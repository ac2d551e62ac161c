// The CPU backend's attention: a query's output is the same bits whether it is computed alone
// (decode) or with other queries sharing its keys (prefill chunks, speculative verification, GQA
// groups), and whatever the number of threads, although the kernel reads the keys in a different
// form for each (key rows for a lone query, keys transposed once per task otherwise) and decode
// splits a query's key segments between threads. Greedy speculative decoding relies on it.
// A half-precision cache gives the bits of an f32 cache holding its rounded values.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/device_buffer.h"

namespace tessera {
namespace {

using test::cpu_backend;
using test::random_floats;

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(cpu_backend(), v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// Attention of one sequence's queries (desc) over its block table, scale 0.3.
AttentionArgs one_sequence(const float* q, float* out, int64_t heads, int64_t window, const DeviceBuffer& desc_buffer,
                           const DeviceBuffer& table, const AttentionSeqDesc& desc) {
  AttentionArgs a;
  a.q = q;
  a.out = out;
  a.n_tokens = desc.q_len;
  a.n_heads = heads;
  a.scale = 0.3f;
  a.window = window;
  a.seqs = desc_buffer.as<AttentionSeqDesc>();
  a.n_seqs = 1;
  a.block_tables = table.as<int32_t>();
  a.max_q_len = desc.q_len;
  a.max_context_len = desc.context_len;
  return a;
}

struct Shape {
  int64_t n_kv_heads, head_dim, window;
  int64_t n_heads = 8;
};

TEST(CpuAttention, AQueryGetsTheSameBitsAloneOrWithOthers) {
  Backend& b = cpu_backend();
  constexpr int64_t kBlock = 16, kContext = 150, kQueries = 7;
  const int threads_before = omp_get_max_threads();
  // Decode of heads wider than 16 walks bands of kv heads (GQA: 4 x 64 and 4 x 24 with a group of
  // 2); prefill reads transposed keys, a GQA group's queries two at a time where the CPU has
  // AVX-512 (groups of 3: a pair and one alone).
  for (const Shape& sh : {Shape{8, 8, 0}, Shape{8, 64, 0}, Shape{4, 8, 0}, Shape{1, 64, 0}, Shape{8, 64, 37},
                          Shape{8, 12, 0}, Shape{2, 12, 0}, Shape{4, 64, 0}, Shape{4, 24, 37}, Shape{4, 64, 0, 12},
                          Shape{4, 24, 0, 12}}) {
    const int64_t heads = sh.n_heads;
    SCOPED_TRACE("heads " + std::to_string(heads) + " kv heads " + std::to_string(sh.n_kv_heads) + " head_dim " +
                 std::to_string(sh.head_dim) + " window " + std::to_string(sh.window));
    const int64_t kv_row = sh.n_kv_heads * sh.head_dim, q_row = heads * sh.head_dim;
    const int64_t blocks = (kContext + kBlock - 1) / kBlock;
    std::vector<int32_t> table(static_cast<size_t>(blocks)), slots(static_cast<size_t>(kContext));
    for (int64_t i = 0; i < blocks; ++i) table[size_t(i)] = int32_t((i * 7 + 3) % blocks);  // scattered (7 and 10 blocks: coprime)
    for (int64_t t = 0; t < kContext; ++t) slots[size_t(t)] = int32_t(table[size_t(t / kBlock)] * kBlock + t % kBlock);
    DeviceBuffer kpool(b, size_t(blocks * kBlock * kv_row) * 4), vpool(b, size_t(blocks * kBlock * kv_row) * 4);
    const KvLayerView kv{kpool.get(), vpool.get(), DType::F32, blocks, kBlock, sh.n_kv_heads, sh.head_dim};
    DeviceBuffer kb = upload(random_floats(size_t(kContext * kv_row), 11, -2, 2));
    DeviceBuffer vb = upload(random_floats(size_t(kContext * kv_row), 12));
    DeviceBuffer sb = upload(slots), tb = upload(table);
    b.kv_write(kv, kb.as<float>(), vb.as<float>(), sb.as<int32_t>(), kContext);
    const auto q = random_floats(size_t(kQueries * q_row), 13, -2, 2);
    DeviceBuffer qb = upload(q);

    auto run = [&](int64_t q0, int64_t q_len) {
      const AttentionSeqDesc desc{0, int32_t(q_len), int32_t(kContext - kQueries + q0 + q_len), 0};
      DeviceBuffer db = upload(std::vector<AttentionSeqDesc>{desc});
      DeviceBuffer ob(b, size_t(q_len * q_row) * 4);
      const AttentionArgs a = one_sequence(qb.as<float>() + q0 * q_row, ob.as<float>(), heads, sh.window, db, tb, desc);
      b.attention(a, kv);
      std::vector<float> out(size_t(q_len * q_row));
      b.copy_to_host(out.data(), ob.get(), out.size() * 4);
      return out;
    };
    const auto together = run(0, kQueries);
    // Decode over 144 to 150 keys: segments of 24 split between 1, 2 or 3 threads; over the
    // window's 37, one segment in bands of heads.
    for (const int threads : {1, 2, 3}) {
      b.set_threads(threads);
      for (int64_t i = 0; i < kQueries; ++i) {
        const auto alone = run(i, 1);
        ASSERT_EQ(0, std::memcmp(alone.data(), together.data() + i * q_row, size_t(q_row) * 4))
            << "query " << i << ", " << threads << " threads";
      }
    }
    b.set_threads(threads_before);
  }
}

float rounded(DType t, float x) { return t == DType::F16 ? fp16_to_f32(f32_to_fp16(x)) : bf16_to_f32(f32_to_bf16(x)); }
uint16_t stored(DType t, float x) { return t == DType::F16 ? f32_to_fp16(x) : f32_to_bf16(x); }

TEST(CpuAttention, AHalfCacheStoresRoundedToNearestEvenLikeTheScalarConversion) {
  Backend& b = cpu_backend();
  constexpr int64_t kRow = 2 * 19;  // not a multiple of 8: the vector loop and its scalar tail
  auto values = random_floats(size_t(kRow), 5, -3, 3);
  const float specials[] = {65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, 6.0e-8f, 2.9e-8f, 1e-40f, -0.0f,
                            std::numeric_limits<float>::infinity(), 1.00048828125f, 1.000732421875f,
                            1.00390625f, 1.005859375f};  // halfway cases for f16 and bf16
  for (size_t i = 0; i < std::size(specials); ++i) values[i * 2] = specials[i];
  for (DType t : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    ASSERT_TRUE(b.supports(Op::kv_write, t) && b.supports(Op::attention, t));
    DeviceBuffer kpool(b, size_t(kRow) * 2), vpool(b, size_t(kRow) * 2);
    const KvLayerView kv{kpool.get(), vpool.get(), t, 1, 1, 2, kRow / 2};
    DeviceBuffer kb = upload(values), slot = upload(std::vector<int32_t>{0});
    b.kv_write(kv, kb.as<float>(), kb.as<float>(), slot.as<int32_t>(), 1);
    for (int64_t i = 0; i < kRow; ++i) {
      EXPECT_EQ(kpool.as<uint16_t>()[i], stored(t, values[size_t(i)])) << "value " << values[size_t(i)];
      EXPECT_EQ(vpool.as<uint16_t>()[i], stored(t, values[size_t(i)])) << "value " << values[size_t(i)];
    }
  }
}

TEST(CpuAttention, AHalfCacheGivesTheBitsOfAnF32CacheOfItsRoundedValues) {
  Backend& b = cpu_backend();
  constexpr int64_t kHeads = 8, kBlock = 16, kContext = 150, kQueries = 7, kSparseBlock = 16;
  for (const Shape& sh : {Shape{8, 64, 0}, Shape{1, 64, 0}, Shape{4, 8, 0}, Shape{8, 64, 37}, Shape{2, 12, 0}}) {
    for (DType t : {DType::F16, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " kv heads " + std::to_string(sh.n_kv_heads) + " head_dim " +
                   std::to_string(sh.head_dim) + " window " + std::to_string(sh.window));
      const int64_t kv_row = sh.n_kv_heads * sh.head_dim, q_row = kHeads * sh.head_dim;
      const int64_t blocks = (kContext + kBlock - 1) / kBlock;
      std::vector<int32_t> table(static_cast<size_t>(blocks)), slots(static_cast<size_t>(kContext));
      for (int64_t i = 0; i < blocks; ++i) table[size_t(i)] = int32_t((i * 3 + 1) % blocks);
      for (int64_t c = 0; c < kContext; ++c) slots[size_t(c)] = int32_t(table[size_t(c / kBlock)] * kBlock + c % kBlock);
      const auto k = random_floats(size_t(kContext * kv_row), 21, -2, 2), v = random_floats(size_t(kContext * kv_row), 22);
      std::vector<float> k_rounded(k.size()), v_rounded(v.size());
      for (size_t i = 0; i < k.size(); ++i) k_rounded[i] = rounded(t, k[i]), v_rounded[i] = rounded(t, v[i]);
      const size_t elems = size_t(blocks * kBlock * kv_row);
      DeviceBuffer hk(b, elems * 2), hv(b, elems * 2), fk(b, elems * 4), fv(b, elems * 4);
      const KvLayerView half{hk.get(), hv.get(), t, blocks, kBlock, sh.n_kv_heads, sh.head_dim};
      const KvLayerView f32{fk.get(), fv.get(), DType::F32, blocks, kBlock, sh.n_kv_heads, sh.head_dim};
      DeviceBuffer kb = upload(k), vb = upload(v), krb = upload(k_rounded), vrb = upload(v_rounded);
      DeviceBuffer sb = upload(slots), tb = upload(table);
      b.kv_write(half, kb.as<float>(), vb.as<float>(), sb.as<int32_t>(), kContext);
      b.kv_write(f32, krb.as<float>(), vrb.as<float>(), sb.as<int32_t>(), kContext);
      DeviceBuffer qb = upload(random_floats(size_t(kQueries * q_row), 23, -2, 2));

      // Block-sparse layout for the queries of [q0, q0 + q_len): every kv head keeps key block 0,
      // every third block and its own (query) block.
      std::vector<int32_t> base{0}, offsets{0}, kept;
      auto sparse_for = [&](int64_t q0, int64_t q_len) {
        offsets.assign(1, 0);
        kept.clear();
        const int64_t first_pos = kContext - kQueries + q0, last_pos = first_pos + q_len - 1;
        for (int64_t h = 0; h < sh.n_kv_heads; ++h) {
          for (int64_t qb = first_pos / kSparseBlock; qb <= last_pos / kSparseBlock; ++qb) {
            for (int64_t kb2 = 0; kb2 <= qb; ++kb2) {
              if (kb2 == 0 || kb2 % 3 == 0 || kb2 == qb) kept.push_back(int32_t(kb2));
            }
            offsets.push_back(int32_t(kept.size()));
          }
        }
      };
      auto run = [&](const KvLayerView& kv, int64_t q0, int64_t q_len, bool sparse) {
        const AttentionSeqDesc desc{0, int32_t(q_len), int32_t(kContext - kQueries + q0 + q_len), 0};
        DeviceBuffer db = upload(std::vector<AttentionSeqDesc>{desc});
        DeviceBuffer ob(b, size_t(q_len * q_row) * 4);
        if (sparse) sparse_for(q0, q_len);
        DeviceBuffer base_b = upload(base), off_b = upload(offsets), kept_b = upload(kept.empty() ? std::vector<int32_t>{0} : kept);
        AttentionArgs a = one_sequence(qb.as<float>() + q0 * q_row, ob.as<float>(), kHeads, sh.window, db, tb, desc);
        if (sparse) a.sparse = {kSparseBlock, base_b.as<int32_t>(), off_b.as<int32_t>(), kept_b.as<int32_t>()};
        b.attention(a, kv);
        std::vector<float> out(size_t(q_len * q_row));
        b.copy_to_host(out.data(), ob.get(), out.size() * 4);
        if (sparse) {  // the block scores that choose the blocks read the cache too
          const int64_t n_qb = (desc.context_len - 1) / kSparseBlock - (desc.context_len - q_len) / kSparseBlock + 1;
          const int64_t stride = (desc.context_len + kSparseBlock - 1) / kSparseBlock;
          std::vector<float> scores(size_t(sh.n_kv_heads * n_qb * stride), 0.0f);
          b.attention_block_scores(a, kv, scores.data());
          out.insert(out.end(), scores.begin(), scores.end());
        }
        return out;
      };
      for (bool sparse : {false, true}) {
        const auto want = run(f32, 0, kQueries, sparse);
        const auto got = run(half, 0, kQueries, sparse);
        ASSERT_EQ(want.size(), got.size());
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << "queries together, sparse " << sparse;
        for (int64_t i = 0; i < kQueries; i += 3) {
          const auto want1 = run(f32, i, 1, sparse), got1 = run(half, i, 1, sparse);
          EXPECT_EQ(0, std::memcmp(want1.data(), got1.data(), want1.size() * 4)) << "query " << i << " alone, sparse " << sparse;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
