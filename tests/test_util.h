// Helpers shared by the tests: the real plugin directory, models and golden files.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/device_buffer.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/model.h"
#include "tessera/pipeline.h"
#include "tessera/registry.h"

namespace tessera::test {

// The message of the tessera::Error that f throws, or "(no error)".
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline const std::string kShared = TESSERA_SHARED_DIR;
inline const std::string kStoriesF32 = kShared + "/models/stories260K/stories260K-f32.gguf";
inline const std::string kStoriesQ8 = kShared + "/models/stories260K/stories260K-q8_0.gguf";
// A `tessera bench` workload small enough for tests: 6 requests, two classes, two users, shared
// system prompts, prompts drawn from the vocabulary.
inline const char* const kTinyBenchWorkload = R"(name: tiny
requests: 6
seed: 11
arrival: { process: closed, concurrency: 3 }
users: { count: 2 }
system_prompt: { length: 24, share: 0.5 }
prompts: { source: vocabulary }
classes:
  - { name: short, weight: 2, prompt: [8, 24], output: [4, 8] }
  - { name: long, weight: 1, prompt: 40, output: 12 }
)";
inline const std::string kAidreamsF32 = kShared + "/models/aidreams260K/aidreams260K-f32.gguf";

// One registry with every plugin of the build tree, shared by a test binary.
inline const Registry& plugins() {
  static const Registry* registry = [] {
    auto* r = new Registry();
    r->load_directory(TESSERA_PLUGIN_DIR);
    return r;
  }();
  return *registry;
}

// A fresh directory under the system temp folder, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw Error("cannot create a temporary directory");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `bytes` to path()/name and returns the file's path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    return file;
  }

 private:
  std::string path_;
};

// The CPU backend from the real plugin, shared by a test binary.
inline Backend& cpu_backend() {
  static std::shared_ptr<Backend> backend = plugins().create<Backend>("cpu", nlohmann::json::object(), "test");
  return *backend;
}

// Deterministic uniform floats in [lo, hi).
// Whether the CPU kernels take their AVX2 paths here (AVX2 and FMA, not hidden by
// TESSERA_CPU_ISA=scalar): packed weight layouts and the shared-GEMV regions exist only there.
inline bool cpu_has_avx2() {
  const char* isa = std::getenv("TESSERA_CPU_ISA");
  if (isa != nullptr && std::string(isa) == "scalar") return false;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#define TESSERA_SKIP_WITHOUT_AVX2() \
  if (!::tessera::test::cpu_has_avx2()) GTEST_SKIP() << "needs AVX2 and FMA (packed layouts), which this CPU lacks or TESSERA_CPU_ISA=scalar hides"

// Whether the CPU kernels' `vnni` variant can run here (AVX-512 VNNI on 256-bit vectors, not hidden
// by TESSERA_CPU_ISA=avx2 or scalar).
inline bool cpu_has_vnni() {
  const char* isa = std::getenv("TESSERA_CPU_ISA");
  if (isa != nullptr && (std::string(isa) == "avx2" || std::string(isa) == "scalar")) return false;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// y = l(x) for m rows of x, through CPU backend memory.
inline std::vector<float> linear_forward(Linear& l, const std::vector<float>& x, int64_t m) {
  Backend& b = cpu_backend();
  DeviceBuffer xb(b, std::max<size_t>(1, x.size()) * sizeof(float));
  DeviceBuffer yb(b, std::max<size_t>(1, size_t(m * l.out_features())) * sizeof(float));
  if (!x.empty()) xb.upload(x.data(), x.size() * sizeof(float));
  l.forward(xb.as<float>(), m, yb.as<float>());
  b.synchronize();
  std::vector<float> y(size_t(m * l.out_features()));
  b.copy_to_host(y.data(), yb.get(), y.size() * sizeof(float));
  return y;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The default pipeline on the CPU, with `model` and optional component overrides:
// {"cache": {"plugin": "contiguous", "max_seqs": 4}}.
inline PipelineSpec cpu_spec(const std::string& model, const nlohmann::json& components = nlohmann::json::object(),
                             DType kv_dtype = DType::F32) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = model;
  spec.backend = "cpu";
  spec.kv_dtype = kv_dtype;
  for (const auto& [kind_text, value] : components.items()) {
    ComponentKind kind;
    if (!parse_kind(kind_text, &kind)) throw Error("bad kind in test: " + kind_text);
    ComponentSpec c;
    c.plugin = value.at("plugin").get<std::string>();
    c.params = value;
    c.params.erase("plugin");
    c.where = "test";
    spec.components[kind] = c;
  }
  return spec;
}

inline std::unique_ptr<Pipeline> cpu_pipeline(const std::string& model,
                                              const nlohmann::json& components = nlohmann::json::object(),
                                              DType kv_dtype = DType::F32) {
  return Pipeline::build(cpu_spec(model, components, kv_dtype), plugins());
}

// What a `tessera` command printed (stdout and stderr together) and its exit status.
struct Output {
  int status = -1;
  std::string text;
};

// Runs a shell command line (its stderr with its stdout where it says 2>&1).
inline Output shell_cmd(const std::string& cmd) {
  Output out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.text.append(buf.data(), n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Runs the built `tessera` with `args` from the source tree, so that pipelines/ and their relative
// model paths resolve.
inline Output tessera_cmd(const std::string& args) {
  return shell_cmd("cd '" TESSERA_SOURCE_DIR "' && '" TESSERA_BINARY "' " + args + " 2>&1");
}

// stories260K with output_norm scaled up to float's limit, written into `dir`: every weight finite
// (the file loads), the head's sums past it, so every logit is infinite or NaN. Returns its path.
inline std::string write_overflowing_model(const TempDir& dir) {
  const std::string path = dir.path() + "/overflow.gguf";
  std::filesystem::copy_file(kStoriesF32, path);
  const auto file = GgufFile::open(kStoriesF32);
  const GgufTensor* norm = file->find_tensor("output_norm.weight");
  if (norm == nullptr || norm->dtype != DType::F32) throw Error("write_overflowing_model: no f32 output_norm");
  const auto* w = static_cast<const float*>(norm->data);
  std::vector<float> scaled(w, w + norm->elements());
  float largest = 0;
  for (const float x : scaled) largest = std::max(largest, std::abs(x));
  for (float& x : scaled) x *= 3e38f / largest;
  std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
  out.seekp(std::streamoff(norm->offset));
  out.write(reinterpret_cast<const char*>(scaled.data()), std::streamsize(scaled.size() * 4));
  return path;
}

// The result of `req` run in a fresh engine beside `companions` (same batch, same steps): with
// per-request seeds, it must not depend on them.
inline GenerationResult run_beside(Pipeline& p, const GenerationRequest& req,
                                   const std::vector<GenerationRequest>& companions = {}) {
  Engine engine(p);
  const RequestId id = engine.submit(req);
  for (const GenerationRequest& other : companions) engine.submit(other);
  engine.run_until_idle();
  for (auto& r : engine.take_finished()) {
    if (r.id == id) return r;
  }
  throw Error("run_beside: the request did not finish");
}

// `n` copies of `req` with seeds seed, seed + 1, ...
inline std::vector<GenerationRequest> reseeded(const GenerationRequest& req, int n, uint64_t seed) {
  std::vector<GenerationRequest> out(size_t(n), req);
  for (int i = 0; i < n; ++i) out[size_t(i)].sampling->seed = seed + uint64_t(i);
  return out;
}

// Logits of a prompt in one step, then of `decode` more tokens one step each.
inline std::vector<std::vector<float>> forward_steps(Model& model, Pipeline& p, const std::vector<int32_t>& prompt,
                                                     int decode) {
  Cache& cache = p.cache();
  const SeqId seq = 4242;
  CacheRequest req{seq, int64_t(prompt.size()) + decode, prompt, "test", false};
  auto plan = cache.plan(std::span<const CacheRequest>(&req, 1));
  if (!plan) throw Error("forward_steps: the cache cannot hold " + std::to_string(req.total_tokens) + " tokens");
  cache.commit(*plan);
  std::vector<std::vector<float>> out;
  ForwardSeq fs{seq, prompt, 0, int64_t(prompt.size())};
  std::vector<float> logits;
  model.forward(std::span<const ForwardSeq>(&fs, 1), p.attention(), cache, logits);
  out.push_back(logits);
  for (int i = 0; i < decode; ++i) {
    const std::vector<int32_t> next = {int32_t((100 + 97 * i) % model.config().vocab)};
    ForwardSeq step{seq, next, int64_t(prompt.size()) + i, 1};
    model.forward(std::span<const ForwardSeq>(&step, 1), p.attention(), cache, logits);
    out.push_back(logits);
  }
  cache.release(seq);
  return out;
}

// forward_steps on two threads and on one: {two, one} (the backend is left on two threads).
inline std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> forward_steps_on_two_and_one(
    Model& model, Pipeline& p, const std::vector<int32_t>& prompt, int decode) {
  p.backend().set_threads(2);
  auto two = forward_steps(model, p, prompt, decode);
  p.backend().set_threads(1);
  auto one = forward_steps(model, p, prompt, decode);
  p.backend().set_threads(2);
  return {std::move(two), std::move(one)};
}

}  // namespace tessera::test
