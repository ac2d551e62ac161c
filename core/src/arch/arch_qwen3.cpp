// qwen3: llama's block with an RMSNorm over each head of q and k before RoPE (attn_q_norm,
// attn_k_norm), no biases, RoPE on NeoX pairs, a head size of its own (attention.key_length).
#include "architecture.h"

namespace tessera {
extern const Architecture kArchQwen3 = {
    .name = "qwen3", .rope_style = RopeStyle::neox, .qk_norm = true, .window_layers = WindowLayers::ignored};
}  // namespace tessera
