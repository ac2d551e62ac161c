// The plugins a benchmark runs: loaded once from the default search path and kept for the whole
// process (benchmarks create components from it until exit).
#pragma once

#include <memory>

#include "tessera/backend.h"
#include "tessera/registry.h"

namespace tessera::bench {

inline const Registry& registry() {
  static const Registry* r = [] {
    auto* reg = new Registry();
    reg->load_default_paths();
    return reg;
  }();
  return *r;
}

// The CPU backend, created once.
inline Backend& cpu_backend() {
  static std::shared_ptr<Backend> b = registry().create<Backend>("cpu", nlohmann::json::object(), "benchmark");
  return *b;
}

}  // namespace tessera::bench
