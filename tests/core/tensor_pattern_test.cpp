#include "tessera/tensor_pattern.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(TensorPattern, MatchesNamesWithOrWithoutTheWeightSuffix) {
  EXPECT_TRUE(tensor_matches("output", "output.weight"));
  EXPECT_TRUE(tensor_matches("output.weight", "output.weight"));
  EXPECT_FALSE(tensor_matches("output", "output_norm.weight"));
  EXPECT_TRUE(tensor_matches("blk.0.*", "blk.0.attn_q.weight"));
  EXPECT_FALSE(tensor_matches("blk.0.*", "blk.10.attn_q.weight"));
  EXPECT_TRUE(tensor_matches("*.attn_?", "blk.3.attn_q.weight"));
  EXPECT_TRUE(tensor_matches("blk.*.ffn_down", "blk.11.ffn_down.weight"));
  EXPECT_FALSE(tensor_matches("blk.*.ffn_down", "blk.11.ffn_up.weight"));
  EXPECT_TRUE(tensor_matches("*", "anything"));
  EXPECT_TRUE(tensor_matches_any({"x", "blk.1.*"}, "blk.1.ffn_up.weight"));
  EXPECT_FALSE(tensor_matches_any({}, "output.weight"));
}

}  // namespace
}  // namespace tessera
