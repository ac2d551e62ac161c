// Test plugin libraries, one source built several ways (see tests/CMakeLists.txt):
//   TESTLIB_VARIANT 1, 2: both register quantizer "dup_test" (duplicate registration)
//   TESTLIB_VARIANT 3: wrong ABI version
//   TESTLIB_VARIANT 4: wrong build identity
//   TESTLIB_VARIANT 5: registration throws
//   TESTLIB_VARIANT 6: no entry point at all
//   TESTLIB_VARIANT 7: a valid plugin that needs a library the loader cannot find (testlib_dep)
//   TESTLIB_VARIANT 8: a valid plugin that calls a function no library defines (a newer SDK's)
//   TESTLIB_VARIANT 9: a manifest with a null build identity
//   TESTLIB_VARIANT 10: quantizers whose factory or make_linear throw exceptions of the plugin's
//                       own types (a std::invalid_argument; a tessera::Error subclass)
#include <memory>
#include <stdexcept>

#include "tessera/plugin.h"

#if TESTLIB_VARIANT == 7
extern "C" int testlib_dep_value();
#elif TESTLIB_VARIANT == 8
extern "C" int testlib_function_no_library_defines();
#endif

namespace {

class NullQuantizer final : public tessera::Quantizer {
 public:
  std::unique_ptr<tessera::Linear> make_linear(tessera::Backend&, const tessera::WeightSource&) override {
    throw tessera::Error("test quantizer");
  }
};

#if TESTLIB_VARIANT == 10
// Its type information and what() live in this library.
class PluginOwnError final : public tessera::Error {
 public:
  PluginOwnError() : tessera::Error("thrown by the plugin's own exception type") {}
};

class ThrowingQuantizer final : public tessera::Quantizer {
 public:
  std::unique_ptr<tessera::Linear> make_linear(tessera::Backend&, const tessera::WeightSource&) override {
    throw PluginOwnError();
  }
};
#endif

[[maybe_unused]] void register_test(tessera::Registrar& r) {
#if TESTLIB_VARIANT == 5
  throw std::runtime_error("deliberate failure in test plugin");
#elif TESTLIB_VARIANT == 7
  if (testlib_dep_value() != 7) throw std::runtime_error("testlib_dep");
#elif TESTLIB_VARIANT == 8
  if (testlib_function_no_library_defines() != 8) throw std::runtime_error("testlib_function_no_library_defines");
#elif TESTLIB_VARIANT == 10
  r.add<tessera::Quantizer>("throwing_test", "test", {}, [](const tessera::Params&) {
    return std::make_unique<ThrowingQuantizer>();
  });
  r.add<tessera::Quantizer>("throwing_factory", "test", {}, [](const tessera::Params&) -> std::unique_ptr<tessera::Quantizer> {
    throw std::invalid_argument("type must be number, but is string");
  });
  return;
#endif
  r.add<tessera::Quantizer>("dup_test", "test", {}, [](const tessera::Params&) { return std::make_unique<NullQuantizer>(); });
}

}  // namespace

#if TESTLIB_VARIANT == 1 || TESTLIB_VARIANT == 2 || TESTLIB_VARIANT == 5 || TESTLIB_VARIANT == 7 || \
    TESTLIB_VARIANT == 8 || TESTLIB_VARIANT == 10
TESSERA_PLUGIN("testlib", register_test)
#elif TESTLIB_VARIANT == 3 || TESTLIB_VARIANT == 4 || TESTLIB_VARIANT == 9
extern "C" __attribute__((visibility("default"))) const tessera::PluginManifest* tessera_plugin_entry() noexcept {
  static const tessera::PluginManifest manifest{
#if TESTLIB_VARIANT == 3
      TESSERA_ABI_VERSION + 1, sizeof(tessera::PluginManifest), TESSERA_BUILD_ID,
#elif TESTLIB_VARIANT == 9
      TESSERA_ABI_VERSION, sizeof(tessera::PluginManifest), nullptr,
#else
      TESSERA_ABI_VERSION, sizeof(tessera::PluginManifest), "tessera-abi1 some-other-stdlib",
#endif
      "testlib", TESSERA_COMPILER_ID, &tessera::detail::register_noexcept<register_test>};
  return &manifest;
}
#else
extern "C" __attribute__((visibility("default"))) int not_a_tessera_plugin() { return 0; }
#endif
