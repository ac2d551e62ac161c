// gpu_bench: the device figures scripts/gpu_check.sh prints, measured through the product's own
// paths (the backend plugin and the engine), on one run:
//   copy      device-to-device copy bandwidth (read + write bytes / s): the decode roofline
//   gemm      f16 and f32 GEMM through the backend's gemm at a large square shape (cuBLAS on CUDA):
//             the prefill ceiling
//   gemv      weight bytes/s of the decode GEMM (m = 1) at the 1b preset's shapes, f16 and int8
//   decode    single-stream decode tokens/s and 64-concurrent throughput on a synthetic model per
//             quantizer, with the single-stream figure as a share of (copy bandwidth / bytes read
//             per token)
//   prefill   one long prompt's time to first token as TFLOP/s, against the f16 GEMM ceiling
//
// Usage: gpu_bench --backend cuda --model 1b-f16.gguf [--quantizers none,int8] [--prompt 1024]
//                  [--tokens 128] [--concurrent 64] [--json out.json]
// Exit status 2 with a message when the backend cannot be created (no device).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_registry.h"
#include "tessera/device_buffer.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/pipeline.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  std::string backend = "cuda";
  std::string model;
  std::vector<std::string> quantizers = {"none", "int8"};
  int64_t prompt = 1024;
  int64_t tokens = 128;
  int64_t concurrent = 64;
  std::string json;
};

// Best of a few timed repetitions of `fn` (each followed by a synchronize).
template <class F>
double best_seconds(Backend& b, int reps, F fn) {
  fn();  // warm-up (first-use library initialisation, allocations)
  b.synchronize();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    b.synchronize();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

double copy_bandwidth(Backend& b) {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer src(b, bytes), dst(b, bytes);
  b.fill_zero(src.get(), bytes);
  const double s = best_seconds(b, 5, [&] { b.copy_on_device(dst.get(), src.get(), bytes); });
  return 2.0 * double(bytes) / s;  // read + write
}

// FLOP/s of y = x · Wᵀ with m = n = k = `size`, weight of type t (f16 or f32).
double gemm_flops(Backend& b, DType t, int64_t size) {
  const int64_t m = size, n = size, k = size;
  const size_t wbytes = dtype_row_bytes(t, k) * size_t(n);
  DeviceBuffer w(b, wbytes), x(b, size_t(m * k) * 4), y(b, size_t(m * n) * 4);
  // Small values (zero bits would let a kernel skip nothing, but keep the data realistic anyway).
  std::vector<uint8_t> host(wbytes);
  std::mt19937 rng(1);
  if (t == DType::F16) {
    for (size_t i = 0; i + 1 < wbytes; i += 2) {
      const uint16_t h = f32_to_fp16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
      std::memcpy(host.data() + i, &h, 2);
    }
  } else {
    for (size_t i = 0; i + 3 < wbytes; i += 4) {
      const float f = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
      std::memcpy(host.data() + i, &f, 4);
    }
  }
  b.copy_to_device(w.get(), host.data(), wbytes);
  b.fill_zero(x.get(), size_t(m * k) * 4);
  const WeightView view{w.get(), t, n, k};
  const double s = best_seconds(b, 3, [&] { b.gemm(x.as<float>(), m, view, y.as<float>()); });
  return 2.0 * double(m) * double(n) * double(k) / s;
}

// Bytes/s a decode-sized GEMM (m = 1) reads from the weight, for one weight of type t (f16, or i8
// with per-row scales) with n rows of k columns: kCalls back-to-back calls per timed repetition, so
// the figure is the kernel's and not one launch's latency.
double gemv_bandwidth(Backend& b, DType t, int64_t n, int64_t k) {
  const size_t wbytes = dtype_row_bytes(t, k) * size_t(n);
  DeviceBuffer w(b, wbytes), scales(b, size_t(n) * 4), x(b, size_t(k) * 4), y(b, size_t(n) * 4);
  std::vector<uint8_t> host(wbytes);
  std::mt19937 rng(2);
  for (auto& byte : host) byte = static_cast<uint8_t>(rng() & 0x3b);  // small finite f16 values, any int8
  b.copy_to_device(w.get(), host.data(), wbytes);
  const std::vector<float> ones(size_t(std::max(n, k)), 0.01f);
  b.copy_to_device(scales.get(), ones.data(), size_t(n) * 4);
  b.copy_to_device(x.get(), ones.data(), size_t(k) * 4);
  WeightView view{w.get(), t, n, k};
  if (t == DType::I8) view.scales = scales.as<float>();
  constexpr int kCalls = 20;
  const double s = best_seconds(b, 5, [&] {
    for (int i = 0; i < kCalls; ++i) b.gemm(x.as<float>(), 1, view, y.as<float>());
  });
  return double(wbytes) * kCalls / s;
}

std::unique_ptr<Pipeline> make_pipeline(const Options& o, const std::string& quantizer, bool graphs,
                                        const Registry& reg) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = o.model;
  spec.backend = o.backend;
  if (!graphs) spec.backend_params = {{"graphs", false}};
  auto set = [&](ComponentKind kind, const std::string& plugin, nlohmann::json params) {
    ComponentSpec c;
    c.plugin = plugin;
    c.params = std::move(params);
    c.where = "gpu_bench";
    spec.components[kind] = c;
  };
  set(ComponentKind::quantizer, quantizer, nlohmann::json::object());
  set(ComponentKind::cache, "paged", {{"block_size", 16}, {"memory", "16GiB"}});
  set(ComponentKind::scheduler, "continuous",
      {{"max_seqs", std::max<int64_t>(o.concurrent, 1)}, {"max_batch_tokens", std::max<int64_t>(o.prompt, 2048)}});
  return Pipeline::build(spec, reg);
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(std::max<int64_t>(n, 1)));
  p[0] = 1;
  for (size_t i = 1; i < p.size(); ++i) p[i] = tok(rng);
  return p;
}

struct DecodeFigures {
  double single_tps = 0;      // one sequence, tokens after the first / their time
  double concurrent_tps = 0;  // all generated tokens / wall time, `concurrent` sequences
  double prefill_s = 0;       // time to first token of one `prompt`-token prompt
  double prefill_flops = 0;
  size_t bytes_per_token = 0;  // weights a decode step reads (everything but the embedding table)
};

DecodeFigures run_model(const Options& o, const std::string& quantizer, bool graphs, const Registry& reg) {
  auto p = make_pipeline(o, quantizer, graphs, reg);
  const ModelConfig& c = p->model().config();
  DecodeFigures f;
  const size_t table = c.tied_output ? 0 : size_t(c.vocab * c.dim) * 2;  // synthetic f16 table (not read whole)
  f.bytes_per_token = p->model().weight_bytes() - std::min(table, p->model().weight_bytes());
  std::mt19937_64 rng(11);

  {  // single stream: timestamps of the generated tokens
    Engine engine(*p);
    std::vector<Clock::time_point> stamps;
    GenerationRequest req;
    req.prompt = random_prompt(rng, 16, c.vocab);
    req.max_tokens = o.tokens;
    req.ignore_eos = true;
    req.on_token = [&](RequestId, int32_t) { stamps.push_back(Clock::now()); };
    engine.submit(req);
    engine.run_until_idle();
    if (stamps.size() >= 2) {
      f.single_tps = double(stamps.size() - 1) / std::chrono::duration<double>(stamps.back() - stamps.front()).count();
    }
  }
  {  // concurrent: wall time of the whole batch (prefills included)
    Engine engine(*p);
    for (int64_t i = 0; i < o.concurrent; ++i) {
      GenerationRequest req;
      req.prompt = random_prompt(rng, 16, c.vocab);
      req.max_tokens = o.tokens;
      req.ignore_eos = true;
      engine.submit(req);
    }
    const auto t0 = Clock::now();
    engine.run_until_idle();
    const double s = seconds_since(t0);
    int64_t generated = 0;
    for (const auto& r : engine.take_finished()) generated += int64_t(r.tokens.size());
    f.concurrent_tps = double(generated) / s;
  }
  {  // prefill: one long prompt, first token only; best of two (the first pays allocations)
    const int64_t T = std::min<int64_t>(o.prompt, c.context_length - 1);
    for (int rep = 0; rep < 2; ++rep) {
      Engine engine(*p);
      GenerationRequest req;
      req.prompt = random_prompt(rng, T, c.vocab);
      req.max_tokens = 1;
      req.ignore_eos = true;
      engine.submit(req);
      const auto t0 = Clock::now();
      engine.run_until_idle();
      const double s = seconds_since(t0);
      f.prefill_s = rep == 0 ? s : std::min(f.prefill_s, s);
    }
    const double kv_dim = double(c.n_kv_heads * c.head_dim);
    const double linear = double(c.n_layers) * (2.0 * c.dim * c.dim + 2.0 * kv_dim * c.dim + 3.0 * c.dim * c.ffn_dim);
    // Linears for every token, the output head for the last one, causal attention (QKᵀ and PV).
    f.prefill_flops = 2.0 * linear * double(T) + 2.0 * double(c.vocab * c.dim) +
                      2.0 * 2.0 * double(c.n_layers) * double(c.dim) * double(T) * double(T + 1) / 2.0;
  }
  return f;
}

int run(const Options& o) {
  const Registry& reg = bench::registry();
  std::shared_ptr<Backend> b;
  try {
    b = reg.create<Backend>(o.backend, nlohmann::json::object(), "gpu_bench");
  } catch (const Error& e) {
    std::cerr << "gpu_bench: " << e.what() << "\n";
    return 2;
  }
  const auto devs = b->devices();
  nlohmann::json out;
  out["backend"] = o.backend;
  out["device"] = devs.empty() ? "" : devs[0].name;
  std::printf("device: %s\n", devs.empty() ? "?" : devs[0].name.c_str());

  const double bw = copy_bandwidth(*b);
  const double f16 = gemm_flops(*b, DType::F16, 8192);
  const double f32 = gemm_flops(*b, DType::F32, 4096);
  // The 1b preset's decode GEMMs: q+k+v, wo, gate+up, down and the output head.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{2560, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632},
                                                           {32000, 2048}};
  std::vector<std::array<double, 2>> gemv(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    gemv[i] = {gemv_bandwidth(*b, DType::F16, shapes[i].first, shapes[i].second),
               gemv_bandwidth(*b, DType::I8, shapes[i].first, shapes[i].second)};
    out["gemv"].push_back({{"n", shapes[i].first}, {"k", shapes[i].second}, {"f16_bytes_per_s", gemv[i][0]},
                           {"i8_bytes_per_s", gemv[i][1]}});
  }
  out["copy_bytes_per_s"] = bw;
  out["gemm_f16_flops"] = f16;
  out["gemm_f32_flops"] = f32;
  b.reset();  // free its memory before the pipelines load

  std::printf("\n%-34s %14s\n", "measurement", "value");
  std::printf("%-34s %11.0f GB/s\n", "device copy bandwidth (rd+wr)", bw / 1e9);
  std::printf("%-34s %11.1f TFLOP/s\n", "gemm f16 8192^3 (backend gemm)", f16 / 1e12);
  std::printf("%-34s %11.1f TFLOP/s\n", "gemm f32 4096^3 (backend gemm)", f32 / 1e12);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string label = "gemv m=1 " + std::to_string(shapes[i].first) + "x" + std::to_string(shapes[i].second);
    std::printf("%-34s %6.0f GB/s f16 %6.0f GB/s int8 (%.0f%% / %.0f%% of copy)\n", label.c_str(), gemv[i][0] / 1e9,
                gemv[i][1] / 1e9, 100.0 * gemv[i][0] / bw, 100.0 * gemv[i][1] / bw);
  }

  if (!o.model.empty()) {
    std::printf("\n%-13s %12s %12s %10s %12s %10s %10s\n", "weights", "1-seq tok/s", "roofline", "share",
                std::to_string(o.concurrent).append("-seq tok/s").c_str(), "prefill", "of f16 gemm");
    // Each quantizer with the backend's defaults, then the first one again launching op by op
    // (backend param graphs: false), the same run's measure of what CUDA graphs bring.
    std::vector<std::pair<std::string, bool>> rows;
    for (const std::string& q : o.quantizers) rows.emplace_back(q, true);
    if (!o.quantizers.empty()) rows.emplace_back(o.quantizers.front(), false);
    for (const auto& [q, graphs] : rows) {
      const std::string label = (q == "none" ? std::string("f16") : q) + (graphs ? "" : " nograph");
      const std::string key = graphs ? q : q + " graphs:false";
      DecodeFigures f;
      try {
        f = run_model(o, q, graphs, reg);
      } catch (const Error& e) {
        std::printf("%-13s failed: %s\n", label.c_str(), e.what());
        out["models"][key]["error"] = e.what();
        continue;
      }
      const double roof = bw / double(f.bytes_per_token);
      const double tflops = f.prefill_flops / f.prefill_s;
      std::printf("%-13s %12.1f %12.1f %9.1f%% %12.1f %7.1f TF %9.1f%%\n", label.c_str(), f.single_tps, roof,
                  100.0 * f.single_tps / roof, f.concurrent_tps, tflops / 1e12, 100.0 * tflops / f16);
      out["models"][key] = {{"single_tokens_per_s", f.single_tps},
                          {"roofline_tokens_per_s", roof},
                          {"bytes_per_token", f.bytes_per_token},
                          {"concurrent", o.concurrent},
                          {"concurrent_tokens_per_s", f.concurrent_tps},
                          {"prefill_tokens", o.prompt},
                          {"prefill_seconds", f.prefill_s},
                          {"prefill_flops_per_s", tflops}};
    }
    std::printf("(roofline: copy bandwidth / weight bytes read per decode step; prefill: %lld-token prompt, "
                "time to first token)\n", static_cast<long long>(o.prompt));
  }
  if (!o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "gpu_bench: " << a << " needs a value\n";
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--backend") {
      o.backend = value();
    } else if (a == "--model") {
      o.model = value();
    } else if (a == "--quantizers") {
      o.quantizers.clear();
      std::stringstream ss(value());
      for (std::string q; std::getline(ss, q, ',');) o.quantizers.push_back(q);
    } else if (a == "--prompt") {
      o.prompt = std::stoll(value());
    } else if (a == "--tokens") {
      o.tokens = std::stoll(value());
    } else if (a == "--concurrent") {
      o.concurrent = std::stoll(value());
    } else if (a == "--json") {
      o.json = value();
    } else {
      std::cerr << "gpu_bench: unknown argument " << a
                << "\nusage: gpu_bench --backend cuda|hip [--model M.gguf] [--quantizers none,int8] [--prompt N] "
                   "[--tokens N] [--concurrent N] [--json FILE]\n";
      return 64;
    }
  }
  try {
    return tessera::run(o);
  } catch (const std::exception& e) {
    std::cerr << "gpu_bench: " << e.what() << "\n";
    return 1;
  }
}
