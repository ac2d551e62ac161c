// Conformance of every communicator (comm kind) through the real loader. Each test holds on any
// number of ranks: in one process (size 1) and again under `mpirun -n 2` (the ctest entry
// comm_conformance_mpi2), where every rank runs the same tests in the same order, as collectives
// require.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/communicator.h"
#include "tessera/error.h"

namespace tessera {
namespace {

class CommConformance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { comm_ = conformance::create_default<Communicator>(GetParam()); }
  std::shared_ptr<Communicator> comm_;
};

TEST_P(CommConformance, RanksAreZeroToSizeAndEachKnowsItsHost) {
  const int size = comm_->size(), rank = comm_->rank();
  ASSERT_GE(size, 1);
  ASSERT_GE(rank, 0);
  ASSERT_LT(rank, size);
  EXPECT_FALSE(comm_->host().empty());
  std::vector<int32_t> ranks(size_t(size), -1);
  const int32_t mine = rank;
  comm_->all_gather(&mine, sizeof mine, ranks.data());
  std::vector<int32_t> expected(static_cast<size_t>(size));
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(ranks, expected);
}

TEST_P(CommConformance, AllReduceSumsEveryRanksValuesOnEveryRank) {
  const int size = comm_->size(), rank = comm_->rank();
  for (const size_t n : {size_t(1), size_t(7), size_t(4096), size_t(100003)}) {
    SCOPED_TRACE(n);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float(i % 1000) + 1000.0f * float(rank);  // exact in float
    comm_->all_reduce_sum(x.data(), n);
    const float ranks_part = 1000.0f * float(size * (size - 1) / 2);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += x[i] != float(size) * float(i % 1000) + ranks_part;
    EXPECT_EQ(wrong, 0u);
  }
}

TEST_P(CommConformance, BroadcastGivesTheRootsBytesToEveryRank) {
  const int size = comm_->size(), rank = comm_->rank();
  for (const int root : {0, size - 1}) {
    std::string text = rank == root ? "from root " + std::to_string(root) : std::string(12, '?');
    text.resize(12);
    comm_->broadcast(text.data(), text.size(), root);
    std::string expected = "from root " + std::to_string(root);
    expected.resize(12);
    EXPECT_EQ(text, expected);
  }
  uint64_t empty = 7;
  comm_->broadcast(&empty, 0, 0);  // nothing to send is no error
  EXPECT_EQ(empty, 7u);
}

TEST_P(CommConformance, SendAndReceiveCarryBytesBetweenRanksAndRefuseRanksOutsideTheJob) {
  const int size = comm_->size(), rank = comm_->rank();
  if (size > 1) {
    // A ring: even ranks send first, odd ones receive first, so that no pair waits on each other.
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    std::vector<int64_t> out(1000, rank), in(1000, -1);
    if (rank % 2 == 0) {
      comm_->send(out.data(), out.size() * 8, next);
      comm_->recv(in.data(), in.size() * 8, prev);
    } else {
      comm_->recv(in.data(), in.size() * 8, prev);
      comm_->send(out.data(), out.size() * 8, next);
    }
    EXPECT_EQ(in, std::vector<int64_t>(1000, prev));
  }
  int32_t v = 0;
  for (const int bad : {-1, size}) {
    try {
      comm_->send(&v, sizeof v, bad);
      ADD_FAILURE() << "send to rank " << bad << " of " << size << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(bad)), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm_->recv(&v, sizeof v, bad), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Comms, CommConformance, testing::ValuesIn(conformance::plugin_names(ComponentKind::comm)),
                         conformance::param_name);

}  // namespace
}  // namespace tessera
