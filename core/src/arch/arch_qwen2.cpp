// qwen2 (Qwen2, Qwen2.5, DeepSeek-R1 distills of Qwen): llama's block with q/k/v biases, RoPE on
// NeoX pairs; full attention on every layer (llama.cpp ignores a declared window).
#include "architecture.h"

namespace tessera {
extern const Architecture kArchQwen2 = {
    .name = "qwen2", .rope_style = RopeStyle::neox, .qkv_bias = true, .window_layers = WindowLayers::ignored};
}  // namespace tessera
