// Tensor-name patterns for per-layer quantization choices, e.g. keep_float: [output, "blk.0.*"].
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Glob match (`*` any run, `?` one character) of `pattern` against a tensor name, with or without
// its ".weight" suffix: "output" matches "output.weight", "blk.0.*" every tensor of block 0,
// "*.attn_*" every attention projection.
bool tensor_matches(std::string_view pattern, std::string_view tensor_name);
bool tensor_matches_any(const std::vector<std::string>& patterns, std::string_view tensor_name);

}  // namespace tessera
