// tessera synth: write a synthetic GGUF of any supported architecture of a preset shape (with overrides) for performance work.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/synth.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {

namespace {

struct SynthArgs {
  std::string preset = "110m";
  std::string arch = "llama";
  std::string rope_scaling = "none";
  std::string vocab_file;
  std::optional<double> rope_factor;
  std::optional<int64_t> head_dim, sliding_window;
  std::string dtype = "f32";
  std::string output;
  std::optional<uint64_t> seed;
  std::optional<int64_t> dim, ffn, layers, heads, kv_heads, vocab, context;
  std::optional<double> rope_theta, rms_eps;
  bool tied = false;
};

constexpr const char* kDtypes =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, "
    "iq3_s; mixed like "
    "llama.cpp's: q3_k_m, q4_k_m, q5_k_m";

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_0") return DType::Q4_0;
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,
                  DType::IQ3_XXS, DType::IQ3_S}) {
    if (s == dtype_name(t)) return t;
  }
  for (const std::string& recipe : synth_recipe_names()) {
    if (s == recipe) return synth_recipe_base(recipe);
  }
  throw Error("--dtype '" + s + "' is not supported (" + std::string(kDtypes) + ")");
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
  if (a.arch == "gemma3") s.rope_theta = 1e6;  // its global layers' base (the local ones take 10000)
  if (a.rope_theta) s.rope_theta = *a.rope_theta;
  if (a.rms_eps) s.rms_eps = *a.rms_eps;
  if (a.seed) s.seed = *a.seed;
  s.tied_output = a.tied;
  s.arch = a.arch;
  if (a.head_dim) s.head_dim = *a.head_dim;
  if (a.sliding_window) s.sliding_window = *a.sliding_window;
  s.rope_scaling = a.rope_scaling;
  if (!a.vocab_file.empty()) {
    s.vocab_file = a.vocab_file;
    s.vocab = int64_t(load_vocabulary(*GgufFile::open(a.vocab_file)).tokens.size());
  }
  if (a.rope_factor) s.rope_factor = *a.rope_factor;
  s.dtype = parse_dtype(a.dtype);
  if (a.dtype.size() > 2 && a.dtype.compare(a.dtype.size() - 2, 2, "_m") == 0) s.recipe = a.dtype;
  validate_synth_spec(s);

  const auto t0 = std::chrono::steady_clock::now();
  write_synthetic_model(s, a.output);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto bytes = std::filesystem::file_size(a.output);
  char params[32];
  std::snprintf(params, sizeof params, "%.1fM", synth_parameter_count(s) / 1e6);
  std::cout << a.output << ": " << s.preset << " " << s.arch << ", " << params << " parameters (dim " << s.dim << ", ffn "
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
  std::string archs;
  for (const auto& n : synth_architectures()) archs += (archs.empty() ? "" : ", ") + n;
  cmd->add_option("--arch", a->arch, "architecture: " + archs)->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "head size (attention.key_length; default dim / heads)");
  cmd->add_option("--sliding-window", a->sliding_window,
                  "sliding window (mistral, gemma2, gemma3; gemma's default: context / 4)");
  cmd->add_option("--rope-scaling", a->rope_scaling, "RoPE scaling: none, linear, yarn, freqs (rope_freqs.weight)")
      ->capture_default_str();
  cmd->add_option("--rope-factor", a->rope_factor, "RoPE scaling factor (default 4)");
  cmd->add_option("--vocab-file", a->vocab_file,
                  "a GGUF whose tokenizer (tokenizer.* keys) the model gets, e.g. ../shared/vocab/ggml-vocab-gpt-2.gguf");
  cmd->add_option("--dtype", a->dtype,
                  "weight type: " + std::string(kDtypes) + " (matrices whose rows are not whole blocks stay f32)")
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
