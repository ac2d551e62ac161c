// The CPU backend's attention: a query's output is the same bits whether it is computed alone
// (decode) or with other queries sharing its keys (prefill chunks, speculative verification, GQA
// groups), although the kernel reads the keys in a different form for each (key rows for a lone
// query, keys transposed once per task otherwise). Greedy speculative decoding relies on it.
#include <gtest/gtest.h>

#include <cstring>
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

struct Shape {
  int64_t n_kv_heads, head_dim, window;
};

TEST(CpuAttention, AQueryGetsTheSameBitsAloneOrWithOthers) {
  Backend& b = cpu_backend();
  constexpr int64_t kHeads = 8, kBlock = 16, kContext = 150, kQueries = 7;
  for (const Shape& sh : {Shape{8, 8, 0}, Shape{8, 64, 0}, Shape{4, 8, 0}, Shape{1, 64, 0}, Shape{8, 64, 37},
                          Shape{8, 12, 0}, Shape{2, 12, 0}}) {
    SCOPED_TRACE("kv heads " + std::to_string(sh.n_kv_heads) + " head_dim " + std::to_string(sh.head_dim) +
                 " window " + std::to_string(sh.window));
    const int64_t kv_row = sh.n_kv_heads * sh.head_dim, q_row = kHeads * sh.head_dim;
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
      AttentionArgs a;
      a.q = qb.as<float>() + q0 * q_row;
      a.out = ob.as<float>();
      a.n_tokens = q_len;
      a.n_heads = kHeads;
      a.scale = 0.3f;
      a.window = sh.window;
      a.seqs = db.as<AttentionSeqDesc>();
      a.n_seqs = 1;
      a.block_tables = tb.as<int32_t>();
      a.max_q_len = int32_t(q_len);
      a.max_context_len = desc.context_len;
      b.attention(a, kv);
      std::vector<float> out(size_t(q_len * q_row));
      b.copy_to_host(out.data(), ob.get(), out.size() * 4);
      return out;
    };
    const auto together = run(0, kQueries);
    for (int64_t i = 0; i < kQueries; ++i) {
      const auto alone = run(i, 1);
      ASSERT_EQ(0, std::memcmp(alone.data(), together.data() + i * q_row, size_t(q_row) * 4)) << "query " << i;
    }
  }
}

}  // namespace
}  // namespace tessera
