// mistral: llama's block; its sliding window (attention.sliding_window) on every layer.
#include "architecture.h"

namespace tessera {
extern const Architecture kArchMistral = {.name = "mistral"};
}  // namespace tessera
