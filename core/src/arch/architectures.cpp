// The table of supported architectures: one description per file (arch_<name>.cpp).
#include "architecture.h"

namespace tessera {

extern const Architecture kArchLlama, kArchMistral, kArchQwen2, kArchQwen3, kArchPhi3, kArchGemma, kArchGemma2,
    kArchGemma3;

namespace {
const Architecture* const kAll[] = {&kArchLlama, &kArchMistral, &kArchQwen2, &kArchQwen3,
                                    &kArchPhi3,  &kArchGemma,   &kArchGemma2, &kArchGemma3};
}  // namespace

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture* a : kAll) {
    if (a->name == name) return a;
  }
  return nullptr;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const Architecture* a : kAll) out.emplace_back(a->name);
  return out;
}

std::string architecture_names() {
  std::string out;
  for (const Architecture* a : kAll) out += (out.empty() ? "" : ", ") + std::string(a->name);
  return out;
}

}  // namespace tessera
