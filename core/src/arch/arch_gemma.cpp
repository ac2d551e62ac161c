// gemma: embeddings times sqrt(dim), GeGLU (GELU, tanh approximation), RoPE on NeoX pairs, the head
// tied to the embeddings. The converter stores RMSNorm weights as 1 + w, so they apply as stored.
#include "architecture.h"

namespace tessera {
extern const Architecture kArchGemma = {.name = "gemma",
                                        .rope_style = RopeStyle::neox,
                                        .activation = FfnActivation::gelu_tanh,
                                        .embed_scale = true,
                                        .window_layers = WindowLayers::ignored};
}  // namespace tessera
