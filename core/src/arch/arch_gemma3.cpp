// gemma3 (text): gemma2's block with q/k norms instead of soft caps, five sliding layers to one
// global (layer il slides where il % 6 < 5), the sliding layers' RoPE at base 10000 unscaled and the
// global ones' at rope.freq_base with the file's RoPE scaling; 27B (62 blocks) scales queries by
// dim / heads, as llama.cpp reads it.
#include "architecture.h"

namespace tessera {
extern const Architecture kArchGemma3 = {.name = "gemma3",
                                         .rope_style = RopeStyle::neox,
                                         .activation = FfnActivation::gelu_tanh,
                                         .qk_norm = true,
                                         .post_norms = true,
                                         .embed_scale = true,
                                         .window_layers = WindowLayers::pattern,
                                         .window_period = 6,
                                         .window_rope_base = 10000.0f,
                                         .attention_scale = AttentionScale::gemma_27b,
                                         .gemma_27b_layers = 62};
}  // namespace tessera
