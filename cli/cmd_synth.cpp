// tessera synth: write a synthetic llama GGUF of a preset shape (with overrides) for performance work.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/synth.h"

namespace tessera::cli {

namespace {

struct SynthArgs {
  std::string preset = "110m";
  std::string dtype = "f32";
  std::string output;
  std::optional<uint64_t> seed;
  std::optional<int64_t> dim, ffn, layers, heads, kv_heads, vocab, context;
  std::optional<double> rope_theta, rms_eps;
  bool tied = false;
};

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  if (s == "q4_k") return DType::Q4_K;
  if (s == "q6_k") return DType::Q6_K;
  throw Error("--dtype '" + s + "' is not supported (f32, f16, bf16, q8_0, q4_0, q4_k, q6_k)");
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

void synth(const SynthArgs& a) {
  SynthSpec s = synth_preset(a.preset);
  // A preset with plain multi-head attention keeps kv_heads = heads when only --heads changes.
  const bool mha = s.n_kv_heads == s.n_heads;
  if (a.dim) s.dim = *a.dim;
  if (a.ffn) s.ffn_dim = *a.ffn;
  if (a.layers) s.n_layers = *a.layers;
  if (a.heads) s.n_heads = *a.heads;
  s.n_kv_heads = a.kv_heads ? *a.kv_heads : (mha ? s.n_heads : s.n_kv_heads);
  if (a.vocab) s.vocab = *a.vocab;
  if (a.context) s.context_length = *a.context;
  if (a.rope_theta) s.rope_theta = *a.rope_theta;
  if (a.rms_eps) s.rms_eps = *a.rms_eps;
  if (a.seed) s.seed = *a.seed;
  s.tied_output = a.tied;
  s.dtype = parse_dtype(a.dtype);
  validate_synth_spec(s);

  const auto t0 = std::chrono::steady_clock::now();
  write_synthetic_model(s, a.output);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto bytes = std::filesystem::file_size(a.output);
  char params[32];
  std::snprintf(params, sizeof params, "%.1fM", synth_parameter_count(s) / 1e6);
  std::cout << a.output << ": " << s.preset << " llama, " << params << " parameters (dim " << s.dim << ", ffn "
            << s.ffn_dim << ", " << s.n_layers << " layers, " << s.n_heads << "/" << s.n_kv_heads
            << " heads, vocab " << s.vocab << ", context " << s.context_length << (s.tied_output ? ", tied" : "")
            << "), " << dtype_name(s.dtype) << ", seed " << s.seed << ", " << human_bytes(double(bytes)) << " in "
            << std::fixed << std::setprecision(2) << secs << " s\n";
  // Matrices whose rows are not whole blocks of the type stay f32 (as llama.cpp falls back): say which.
  const int64_t block = dtype_block_elems(s.dtype);
  const bool dim_kept = s.dim % block != 0, ffn_kept = s.ffn_dim % block != 0;
  if (dim_kept || ffn_kept) {
    const std::string which = dim_kept && ffn_kept ? "every matrix stays"
                              : dim_kept           ? "every matrix but ffn_down stays"
                                                   : "ffn_down stays";
    const std::string rows = dim_kept && ffn_kept ? std::to_string(s.dim) + " and " + std::to_string(s.ffn_dim)
                                                  : std::to_string(dim_kept ? s.dim : s.ffn_dim);
    std::cerr << "note: " << which << " f32: rows of " << rows << " are not whole " << dtype_name(s.dtype)
              << " blocks of " << block << "\n";
  }
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  std::string presets;
  for (const auto& p : synth_preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  CLI::App* cmd = app.add_subcommand("synth", "Write a synthetic llama GGUF (random weights) of a given shape");
  cmd->add_option("--preset", a->preset, "shape preset: " + presets)->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "weight type: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k (matrices whose rows are not whole "
                  "blocks stay f32)")
      ->capture_default_str();
  cmd->add_option("-o,--output", a->output, "GGUF file to write")->required();
  cmd->add_option("--seed", a->seed, "weight seed (default 0)")->check(kSeed);
  cmd->add_option("--dim", a->dim, "embedding size");
  cmd->add_option("--ffn", a->ffn, "feed-forward size");
  cmd->add_option("--layers", a->layers, "number of blocks");
  cmd->add_option("--heads", a->heads, "attention heads");
  cmd->add_option("--kv-heads", a->kv_heads, "key/value heads (default: the preset's; = heads for MHA presets)");
  cmd->add_option("--vocab", a->vocab, "vocabulary size (>= 260)");
  cmd->add_option("--context", a->context, "context length");
  cmd->add_option("--rope-theta", a->rope_theta, "RoPE base frequency");
  cmd->add_option("--rms-eps", a->rms_eps, "RMSNorm epsilon");
  cmd->add_flag("--tied", a->tied, "no output.weight: the head reads token_embd");
  cmd->callback([a] { synth(*a); });
}

}  // namespace tessera::cli
