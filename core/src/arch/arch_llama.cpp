// llama: pre-norm blocks, SwiGLU, RoPE on adjacent pairs (the converter permutes q/k for it), RoPE
// scaling linear / YaRN and Llama 3's per-pair factors (rope_freqs.weight); q/k/v/o biases where a
// file has them; the window, where declared, on every layer.
#include "architecture.h"

namespace tessera {
extern const Architecture kArchLlama = {.name = "llama"};
}  // namespace tessera
