// phi3 (Phi-3, Phi-3.5 mini): q, k and v in one tensor (attn_qkv), gate and up in one (ffn_up, gate
// first), RoPE on NeoX pairs. llama.cpp runs it without its declared sliding window (its converter
// does not say which layers slide); so does this. LongRoPE files (rope_factors_long/short) are refused.
#include "architecture.h"

namespace tessera {
extern const Architecture kArchPhi3 = {.name = "phi3",
                                       .rope_style = RopeStyle::neox,
                                       .fused_qkv = true,
                                       .fused_gate_up = true,
                                       .window_layers = WindowLayers::ignored};
}  // namespace tessera
