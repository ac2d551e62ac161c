// The plugin boundary. A plugin library exports exactly one symbol, `tessera_plugin_entry`, a
// noexcept C function returning its manifest. The host checks the ABI version and the build identity
// before it calls anything else in the library, and refuses a mismatch naming the file.
//
// Write a plugin like this (everything else in the library stays hidden):
//
//   static void register_all(tessera::Registrar& r) {
//     r.add<tessera::Quantizer>("mine", "what it does", {/* ParamSpecs */},
//                               [](const tessera::Params& p) { return std::make_unique<Mine>(p); });
//   }
//   TESSERA_PLUGIN("my_plugin", register_all)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>

#include "tessera/registrar.h"

// Bumped on any change to the interfaces in core/include/tessera that breaks binary compatibility.
#define TESSERA_ABI_VERSION 11u

#define TESSERA_STR_(x) #x
#define TESSERA_STR(x) TESSERA_STR_(x)
#if defined(__clang__)
#define TESSERA_COMPILER_ID "clang-" TESSERA_STR(__clang_major__)
#elif defined(__GNUC__)
#define TESSERA_COMPILER_ID "gcc-" TESSERA_STR(__GNUC__)
#else
#define TESSERA_COMPILER_ID "unknown-compiler"
#endif
#if defined(_GLIBCXX_RELEASE)
#define TESSERA_STDLIB_ID "libstdc++-" TESSERA_STR(_GLIBCXX_RELEASE) "-abi" TESSERA_STR(_GLIBCXX_USE_CXX11_ABI)
#elif defined(_LIBCPP_VERSION)
#define TESSERA_STDLIB_ID "libc++-" TESSERA_STR(_LIBCPP_VERSION)
#else
#define TESSERA_STDLIB_ID "unknown-stdlib"
#endif
// libstdc++'s debug mode changes the layout of its containers (a StepPlan's vectors).
#if defined(_GLIBCXX_DEBUG)
#define TESSERA_STDLIB_MODE " debug"
#else
#define TESSERA_STDLIB_MODE ""
#endif
// C++ objects (std::string, std::function, exceptions) cross the boundary, so host and plugin
// must agree on the standard library, its ABI and its mode; the compiler family is recorded for
// the message.
#define TESSERA_BUILD_ID "tessera-abi" TESSERA_STR(TESSERA_ABI_VERSION) " " TESSERA_STDLIB_ID TESSERA_STDLIB_MODE

namespace tessera {

using RegisterFn = void (*)(Registrar&);

// Append-only: new fields go at the end, and manifest_size tells the host which exist.
struct PluginManifest {
  uint32_t abi_version;
  uint32_t manifest_size;
  const char* build_id;
  const char* library_name;
  const char* compiler;
  // Registers the library's factories; returns false and writes a message on failure.
  bool (*register_components)(Registrar& registrar, char* error, size_t error_size) noexcept;
};

namespace detail {
template <RegisterFn F>
bool register_noexcept(Registrar& registrar, char* error, size_t error_size) noexcept {
  try {
    F(registrar);
    return true;
  } catch (const std::exception& e) {
    std::strncpy(error, e.what(), error_size - 1);
  } catch (...) {
    std::strncpy(error, "unknown exception during registration", error_size - 1);
  }
  error[error_size - 1] = '\0';
  return false;
}
}  // namespace detail

}  // namespace tessera

#define TESSERA_PLUGIN_ENTRY_SYMBOL "tessera_plugin_entry"

#define TESSERA_PLUGIN(library_name, register_fn)                                              \
  extern "C" __attribute__((visibility("default"))) const ::tessera::PluginManifest*          \
  tessera_plugin_entry() noexcept {                                                           \
    static const ::tessera::PluginManifest manifest{                                          \
        TESSERA_ABI_VERSION, sizeof(::tessera::PluginManifest), TESSERA_BUILD_ID,             \
        library_name, TESSERA_COMPILER_ID, &::tessera::detail::register_noexcept<register_fn>}; \
    return &manifest;                                                                         \
  }
