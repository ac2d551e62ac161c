// gemma2: gemma's block plus a norm on each sublayer's output before the residual add
// (post_attention_norm, post_ffw_norm), attention and final logits soft-capped
// (attn_logit_softcapping, final_logit_softcapping), the window on even layers (0, 2, ...), and the
// 27B model's query_pre_attn_scalar = dim / heads (46 blocks), as llama.cpp reads it.
#include "architecture.h"

namespace tessera {
extern const Architecture kArchGemma2 = {.name = "gemma2",
                                         .rope_style = RopeStyle::neox,
                                         .activation = FfnActivation::gelu_tanh,
                                         .post_norms = true,
                                         .embed_scale = true,
                                         .softcaps = true,
                                         .window_layers = WindowLayers::pattern,
                                         .window_period = 2,
                                         .default_window = 4096,
                                         .attention_scale = AttentionScale::gemma_27b,
                                         .gemma_27b_layers = 46};
}  // namespace tessera
