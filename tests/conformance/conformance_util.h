// Shared plumbing for the conformance suites. Every suite reaches plugins the way the product does:
// one Registry that loads the build's plugin directory (never a linked plugin symbol), so a plugin
// added later is picked up without editing a test. Data comes from fixed seeds.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tessera/backend.h"
#include "tessera/component.h"
#include "tessera/device_buffer.h"
#include "tessera/registry.h"

namespace tessera::conformance {

// What the suites run against. The in-tree test binary leaves it unset and loads the build's
// plugin directory (TESSERA_PLUGIN_DIR); tessera-conformance (conformance_main.cpp) sets it before
// gtest instantiates the suites, to test libraries given by path.
struct Target {
  // Extra libraries to load after the default search path; when non-empty, the suites run only
  // the plugins these libraries register (the rest are loaded as the platform they run on, e.g.
  // the cpu backend that component plugins need).
  std::vector<std::string> libraries;
};
void set_target(Target target);  // before the first registry() call

// Loaded once and kept for the life of the process: TESSERA_PLUGIN_DIR in the in-tree tests; the
// default search path (TESSERA_PLUGIN_PATH, beside libtessera_core, the install prefix) plus the
// target's libraries in tessera-conformance. Throws Error when a target library is refused.
Registry& registry();

// Where plugins come from, for messages ("the plugin directory X" or the search path).
std::string plugin_source();

// Names of the loaded plugins of `kind` under test (all of them, or those the target libraries
// register), sorted. Used as the parameter list of each suite, so every plugin of the kind is
// exercised.
std::vector<std::string> plugin_names(ComponentKind kind);

// Libraries in the plugin directory that failed to load, one per line ("" when none).
std::string load_failures();

// Gives a test instance the plugin's name (non-alphanumerics become '_', as gtest requires).
std::string param_name(const testing::TestParamInfo<std::string>& info);

// Creates `name` with its declared defaults, as a pipeline that names only the plugin would.
template <class T>
std::shared_ptr<T> create_default(const std::string& name) {
  return registry().create<T>(name, nlohmann::json::object(), "conformance test");
}

// Parameter sets to run a plugin with: its defaults, then each allowed value of every string
// parameter that declares choices (e.g. a quantizer's target dtype), one at a time.
struct Variant {
  std::string label;  // "defaults" or "name=value"
  nlohmann::json params;
};
std::vector<Variant> choice_variants(ComponentKind kind, const std::string& name);
// Why this CPU cannot run `variant` ("kernel=vnni needs AVX-512 VNNI ..."), or "" when it can: the
// CPU kernels that name an instruction set (`kernel: vnni`, and oneDNN's `kernel: dnnl`, which
// needs VNNI too) are refused where the CPU lacks it or TESSERA_CPU_ISA (avx2, scalar) hides it.
std::string missing_cpu_isa(const Variant& variant);

// The CPU backend that component plugins run on (shared; it is stateless apart from memory).
Backend& cpu();

// Uniform values in [lo, hi) from a fixed seed.
std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<int32_t> random_ints(size_t n, uint64_t seed, int32_t lo, int32_t hi);  // [lo, hi]

// Backend memory helpers. Uploads go through copy_to_device, reads through copy_to_host, so the
// suites work unchanged on a device whose memory the host cannot touch.
template <class T>
DeviceBuffer upload(Backend& b, std::span<const T> host, size_t extra_elems = 0) {
  DeviceBuffer buf(b, (host.size() + extra_elems) * sizeof(T) + (host.empty() && extra_elems == 0 ? 1 : 0));
  if (!host.empty()) b.copy_to_device(buf.get(), host.data(), host.size() * sizeof(T));
  return buf;
}
template <class T>
DeviceBuffer upload(Backend& b, const std::vector<T>& host, size_t extra_elems = 0) {
  return upload(b, std::span<const T>(host), extra_elems);
}
template <class T>
std::vector<T> download(Backend& b, const void* src, size_t n) {
  std::vector<T> out(n);
  if (n > 0) b.copy_to_host(out.data(), src, n * sizeof(T));
  return out;
}

// A buffer of `n` floats filled with NaN, so an output the kernel forgot to write (or a value read
// from memory nobody wrote) cannot pass a comparison by accident.
DeviceBuffer poisoned_floats(Backend& b, size_t n);
void poison(Backend& b, void* dst, size_t n_floats);

// sqrt(sum (got - want)^2 / sum want^2): error relative to the signal, independent of scale.
double normalized_rms_error(std::span<const float> got, std::span<const double> want);

inline bool all_nan(std::span<const float> v) {
  for (float x : v) {
    if (!std::isnan(x)) return false;
  }
  return true;
}

// Passes when |got[i] - want[i]| <= bound(i) for every i (NaN never passes); on failure names the
// count of bad elements and the first one.
template <class Bound>
testing::AssertionResult all_close(std::span<const float> got, std::span<const double> want, Bound bound) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= bound(i))) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << bad << " of " << want.size() << " values out of bounds; first at ["
                                     << first << "]: got " << got[first] << ", want " << want[first]
                                     << ", allowed error " << bound(first);
}

}  // namespace tessera::conformance
