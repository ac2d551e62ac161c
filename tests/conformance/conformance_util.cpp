#include "conformance/conformance_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace tessera::conformance {

namespace {

Target& target() {
  static Target t;
  return t;
}

// The target libraries as the registry names them (PluginEntry::library is canonical).
std::vector<std::string> canonical_libraries() {
  std::vector<std::string> out;
  for (const std::string& lib : target().libraries) out.push_back(std::filesystem::weakly_canonical(lib).string());
  return out;
}

void load(Registry& reg) {
#ifdef TESSERA_PLUGIN_DIR
  if (target().libraries.empty()) {
    reg.load_directory(TESSERA_PLUGIN_DIR);
    return;
  }
#endif
  reg.load_default_paths();
  // A library already found on the search path is not loaded twice; one that was refused there is
  // tried again here, so its refusal (ABI, build identity, duplicate name) is thrown, not listed.
  for (const std::string& lib : target().libraries) reg.load_library(lib);
}

}  // namespace

void set_target(Target t) { target() = std::move(t); }

Registry& registry() {
  static Registry reg;
  static const bool loaded = (load(reg), true);
  (void)loaded;
  return reg;
}

std::string plugin_source() {
#ifdef TESSERA_PLUGIN_DIR
  if (target().libraries.empty()) return TESSERA_PLUGIN_DIR;
#endif
  std::string out;
  for (const auto& lib : target().libraries) out += (out.empty() ? "" : ", ") + lib;
  for (const auto& dir : Registry::default_search_path()) out += (out.empty() ? "" : ", ") + dir.string();
  return out;
}

std::vector<std::string> plugin_names(ComponentKind kind) {
  const std::vector<std::string> libs = canonical_libraries();
  std::vector<std::string> names;
  for (const PluginEntry* e : registry().entries(kind)) {
    if (libs.empty() || std::find(libs.begin(), libs.end(), e->library) != libs.end()) names.push_back(e->name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string load_failures() {
  std::string out;
  for (const LoadFailure& f : registry().failures()) out += f.library + ": " + f.message + "\n";
  return out;
}

std::string param_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

std::vector<Variant> choice_variants(ComponentKind kind, const std::string& name) {
  std::vector<Variant> out = {{"defaults", nlohmann::json::object()}};
  for (const ParamSpec& spec : registry().require(kind, name).params) {
    if (spec.type != ParamType::string) continue;
    for (const std::string& choice : spec.choices) {
      if (spec.default_value == choice) continue;  // already covered by the defaults
      out.push_back({spec.name + "=" + choice, nlohmann::json{{spec.name, choice}}});
    }
  }
  return out;
}

std::string missing_cpu_isa(const Variant& variant) {
  const auto kernel = variant.params.find("kernel");
  if (kernel == variant.params.end() || !kernel->is_string()) return "";
  const std::string name = kernel->get<std::string>();
  if (name != "vnni" && name != "dnnl") return "";
  const char* isa = std::getenv("TESSERA_CPU_ISA");
  if (isa != nullptr && (std::string(isa) == "avx2" || std::string(isa) == "scalar")) {
    return "kernel=" + name + " needs AVX-512 VNNI, hidden by TESSERA_CPU_ISA=" + isa;
  }
  __builtin_cpu_init();
  const bool vnni = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vnni");
  return vnni ? "" : "kernel=" + name + " needs AVX-512 VNNI (avx512vnni, avx512vl, avx512bw), which this CPU lacks";
}

Backend& cpu() {
  static std::shared_ptr<Backend> backend = create_default<Backend>("cpu");
  return *backend;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> random_ints(size_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

void poison(Backend& b, void* dst, size_t n_floats) {
  const std::vector<float> nans(n_floats, std::numeric_limits<float>::quiet_NaN());
  if (n_floats > 0) b.copy_to_device(dst, nans.data(), n_floats * sizeof(float));
}

DeviceBuffer poisoned_floats(Backend& b, size_t n) {
  DeviceBuffer buf(b, std::max<size_t>(n, 1) * sizeof(float));
  poison(b, buf.get(), n);
  return buf;
}

double normalized_rms_error(std::span<const float> got, std::span<const double> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace tessera::conformance
