// The plugins a benchmark runs: loaded once from the default search path and kept for the whole
// process (benchmarks create components from it until exit).
#pragma once

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

}  // namespace tessera::bench
