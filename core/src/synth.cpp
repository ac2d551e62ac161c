// Synthetic models of every supported architecture: preset shapes, a deterministic SentencePiece-style vocabulary and
// seeded Gaussian weights, streamed through GgufWriter one tensor at a time.
#include "tessera/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <queue>
#include <unordered_set>
#include <variant>

#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/quantize_blocks.h"

namespace tessera {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space marker
constexpr int64_t kMinVocab = 260;                 // 3 specials + 256 bytes + "▁"
constexpr int64_t kMaxDim = int64_t(1) << 24;      // what read_model_config accepts
constexpr int64_t kMaxLayers = 4096;                // 8x llama.cpp's LLAMA_MAX_LAYERS; 9 tensors each

// One metadata value as the source file stored it.
void copy_value(GgufWriter& w, const std::string& key, const GgufValue& v) {
  switch (v.type) {
    case GgufType::STRING: w.add_string(key, std::get<std::string>(v.scalar)); return;
    case GgufType::BOOL: w.add_bool(key, std::get<bool>(v.scalar)); return;
    case GgufType::FLOAT32: w.add_float32(key, static_cast<float>(std::get<double>(v.scalar))); return;
    case GgufType::FLOAT64: w.add_float64(key, std::get<double>(v.scalar)); return;
    case GgufType::ARRAY: break;
    default: {  // integers: GgufValue holds unsigned ones as uint64_t, signed as int64_t
      const int64_t as_i64 = std::holds_alternative<uint64_t>(v.scalar) ? int64_t(std::get<uint64_t>(v.scalar))
                                                                         : std::get<int64_t>(v.scalar);
      switch (v.type) {
        case GgufType::UINT8: w.add_uint8(key, uint8_t(as_i64)); return;
        case GgufType::INT8: w.add_int8(key, int8_t(as_i64)); return;
        case GgufType::UINT16: w.add_uint16(key, uint16_t(as_i64)); return;
        case GgufType::INT16: w.add_int16(key, int16_t(as_i64)); return;
        case GgufType::UINT32: w.add_uint32(key, uint32_t(as_i64)); return;
        case GgufType::INT32: w.add_int32(key, int32_t(as_i64)); return;
        case GgufType::UINT64: w.add_uint64(key, uint64_t(as_i64)); return;
        default: w.add_int64(key, as_i64); return;
      }
    }
  }
  switch (v.elem_type) {
    case GgufType::STRING: w.add_string_array(key, v.strings); return;
    case GgufType::FLOAT32: {
      const std::vector<float> f(v.floats.begin(), v.floats.end());
      w.add_float32_array(key, f);
      return;
    }
    case GgufType::FLOAT64: w.add_float64_array(key, v.floats); return;
    case GgufType::INT32: {
      const std::vector<int32_t> i(v.ints.begin(), v.ints.end());
      w.add_int32_array(key, i);
      return;
    }
    case GgufType::UINT32: {
      const std::vector<uint32_t> i(v.ints.begin(), v.ints.end());
      w.add_uint32_array(key, i);
      return;
    }
    case GgufType::INT64: w.add_int64_array(key, v.ints); return;
    default: throw Error("synth: cannot copy '" + key + "': arrays of " + std::string(gguf_type_name(v.elem_type)));
  }
}

int64_t synth_head_dim(const SynthSpec& s) { return s.head_dim > 0 ? s.head_dim : s.dim / s.n_heads; }
bool synth_tied(const SynthSpec& s) { return s.tied_output || s.arch.rfind("gemma", 0) == 0; }

struct Preset {
  const char* name;
  int64_t dim, ffn, layers, heads, kv_heads, vocab, context;
};
constexpr Preset kPresets[] = {
    {"tiny", 64, 172, 2, 4, 2, 512, 256},
    {"110m", 768, 2048, 12, 12, 12, 32000, 1024},
    {"110m-gqa", 768, 2048, 12, 12, 4, 32000, 1024},
    {"1b", 2048, 5632, 22, 32, 4, 32000, 2048},
};

// ---- vocabulary ----

// English letter frequencies (percent), anywhere in a word and at its start. They only steer which
// letter strings become pieces, so that the vocabulary looks like a trained one (common short
// pieces first) without shipping one.
constexpr double kLetterFreq[26] = {8.2, 1.5, 2.8, 4.3, 12.7, 2.2, 2.0, 6.1, 7.0, 0.15, 0.77, 4.0, 2.4,
                                    6.7, 7.5, 1.9, 0.1, 6.0, 6.3, 9.1, 2.8, 1.0, 2.4, 0.15, 2.0, 0.07};
constexpr double kInitialFreq[26] = {11.7, 4.4, 5.2, 3.2, 2.8, 4.0, 1.6, 4.2, 7.3, 0.5, 0.9, 2.4, 3.8,
                                     2.3, 7.6, 4.3, 0.2, 2.8, 6.7, 16.0, 1.2, 0.8, 5.5, 0.05, 0.8, 0.05};

bool is_vowel(char c) {
  c = static_cast<char>(c | 0x20);
  return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u' || c == 'y';
}

// A letter Markov chain: P(next | last) favours alternating vowels and consonants.
struct LetterChain {
  double p[26][26];
  int order[26][26];  // next letters of each last letter, most likely first

  LetterChain() {
    for (int a = 0; a < 26; ++a) {
      double sum = 0;
      for (int b = 0; b < 26; ++b) {
        double w = kLetterFreq[b] * (is_vowel(char('a' + a)) != is_vowel(char('a' + b)) ? 1.6 : 0.6);
        if (a == b) w *= 0.2;  // doubled letters are rarer than their frequencies suggest
        if (a == 'q' - 'a') w = b == 'u' - 'a' ? 100.0 : 0.01;
        p[a][b] = w;
        sum += w;
      }
      for (int b = 0; b < 26; ++b) {
        p[a][b] /= sum;
        order[a][b] = b;
      }
      std::stable_sort(order[a], order[a] + 26, [&](int x, int y) { return p[a][x] > p[a][y]; });
    }
  }
};

// Best-first enumeration of letter strings by chain probability. Each node pushes its first child
// and, when taken, its next sibling, so the queue stays as small as the vocabulary.
struct Candidate {
  double score;
  double parent_score;
  int rank;  // index of the last letter in the parent's order
  std::string text;
  bool operator<(const Candidate& o) const {  // priority_queue pops the largest
    return score != o.score ? score < o.score : text > o.text;
  }
};

Vocabulary build_vocabulary(int64_t size) {
  Vocabulary v;
  v.model = "llama";
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  v.add_bos = true;
  v.add_space_prefix = true;
  v.tokens.reserve(static_cast<size_t>(size));
  std::unordered_set<std::string> seen;
  auto add = [&](std::string text, float score, int32_t type) {
    if (static_cast<int64_t>(v.tokens.size()) >= size || !seen.insert(text).second) return;
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, kTokenUnknown);
  add("<s>", 0, kTokenControl);
  add("</s>", 0, kTokenControl);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0, kTokenByte);
  }
  int64_t rank = 0;
  auto normal = [&](std::string text) { add(std::move(text), static_cast<float>(-rank++), kTokenNormal); };
  normal(std::string(kSpace));
  for (char c = 33; c < 127; ++c) normal(std::string(1, c));
  for (char c = 33; c < 127; ++c) normal(std::string(kSpace) + c);

  static const LetterChain chain;
  std::priority_queue<Candidate> queue;
  auto push_child = [&](const std::string& parent, double parent_score, int rank_in_parent) {
    if (rank_in_parent >= 26) return;
    const int last = (parent.back() | 0x20) - 'a';
    const int next = chain.order[last][rank_in_parent];
    queue.push({parent_score * chain.p[last][next], parent_score, rank_in_parent, parent + char('a' + next)});
  };
  // Roots: word-internal letters, word starts, capitalised word starts.
  for (int c = 0; c < 26; ++c) {
    push_child(std::string(1, char('a' + c)), kLetterFreq[c] / 100 * 0.5, 0);
    push_child(std::string(kSpace) + char('a' + c), kInitialFreq[c] / 100, 0);
    push_child(std::string(kSpace) + char('A' + c), kInitialFreq[c] / 100 * 0.15, 0);
  }
  while (static_cast<int64_t>(v.tokens.size()) < size) {
    Candidate c = queue.top();
    queue.pop();
    push_child(c.text.substr(0, c.text.size() - 1), c.parent_score, c.rank + 1);
    push_child(c.text, c.score, 0);
    normal(std::move(c.text));
  }
  return v;
}

// ---- weights ----

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Per-tensor stream key: the seed and the tensor name, so a tensor's values do not depend on
// which other tensors the model has (e.g. --layers 3 keeps layers 0-1 of the 2-layer model).
uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return splitmix64(seed ^ splitmix64(h));
}

// Row r of a tensor: approximately N(0, std^2) as the Irwin-Hall sum of four 16-bit uniforms
// from one 64-bit hash of (key, r, j) - several times cheaper than Box-Muller, which matters at a
// billion weights; bounded at 3.46 std. Values depend only on (key, r, j), not on thread count.
void gaussian_row(uint64_t key, int64_t r, int64_t n, float std_dev, float* out) {
  const uint64_t row_key = splitmix64(key + static_cast<uint64_t>(r) * 0xD1B54A32D192ED03ull);
  // Sum of four U[0, 65535] has mean 131070 and variance 4 * (65536^2 - 1) / 12.
  const float scale = std_dev / std::sqrt(4.0f * (65536.0f * 65536.0f - 1.0f) / 12.0f);
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t h = splitmix64(row_key + static_cast<uint64_t>(j));
    const int64_t sum = static_cast<int64_t>((h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + (h >> 48));
    out[j] = static_cast<float>(sum - 131070) * scale;
  }
}

// Fills a [cols, rows] (ggml order) tensor of `dtype`, rows in parallel.
void fill_gaussian(uint8_t* dst, int64_t rows, int64_t cols, DType dtype, uint64_t key, float std_dev) {
  const size_t row_bytes = dtype_row_bytes(dtype, cols);
#pragma omp parallel
  {
    std::vector<float> scratch(dtype == DType::F32 ? 0 : static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* out = dst + static_cast<size_t>(r) * row_bytes;
      if (dtype == DType::F32) {
        gaussian_row(key, r, cols, std_dev, reinterpret_cast<float*>(out));
      } else {
        gaussian_row(key, r, cols, std_dev, scratch.data());
        quantize_row(dtype, scratch.data(), out, cols);
      }
    }
  }
}

// Matrices keep the requested type unless their rows are not whole blocks (ffn 172 with Q8_0):
// those stay F32, as llama.cpp falls back for tensors a block type cannot hold.
DType matrix_dtype(DType want, int64_t row_length) {
  return row_length % dtype_block_elems(want) == 0 ? want : DType::F32;
}

// llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q8_0, MOSTLY_Q4_K_S, MOSTLY_Q6_K, MOSTLY_BF16
uint32_t file_type(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q8_0: return 7;
    case DType::Q4_K: return 14;
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    case DType::Q4_1: return 3;  // and the other block formats' MOSTLY_ types (k-quants: their _S)
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q2_K: return 10;
    case DType::Q3_K: return 11;
    case DType::Q5_K: return 16;
    case DType::IQ4_NL: return 25;
    case DType::IQ4_XS: return 30;
    case DType::IQ2_XXS: return 19;
    case DType::IQ2_XS: return 20;
    case DType::IQ2_S: return 28;
    case DType::IQ3_XXS: return 23;
    case DType::IQ3_S: return 26;
    default: return 0;
  }
}

std::string preset_list() {
  std::string out;
  for (const Preset& p : kPresets) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

}  // namespace

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

SynthSpec synth_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      SynthSpec s;
      s.preset = p.name;
      s.dim = p.dim;
      s.ffn_dim = p.ffn;
      s.n_layers = p.layers;
      s.n_heads = p.heads;
      s.n_kv_heads = p.kv_heads;
      s.vocab = p.vocab;
      s.context_length = p.context;
      return s;
    }
  }
  throw Error("unknown synth preset '" + name + "' (presets: " + preset_list() + ")");
}

void validate_synth_spec(const SynthSpec& s) {
  auto range = [](const char* field, int64_t v, int64_t lo, int64_t hi = kMaxDim) {
    if (v < lo || v > hi) {
      throw Error("synth: " + std::string(field) + " = " + std::to_string(v) + " is outside " +
                  std::to_string(lo) + ".." + std::to_string(hi));
    }
  };
  range("dim", s.dim, 2);
  range("ffn_dim", s.ffn_dim, 1);
  range("layers", s.n_layers, 1, kMaxLayers);
  range("heads", s.n_heads, 1);
  range("kv_heads", s.n_kv_heads, 1);
  range("vocab", s.vocab, kMinVocab);
  range("context_length", s.context_length, 1);
  const auto& archs = synth_architectures();
  if (std::find(archs.begin(), archs.end(), s.arch) == archs.end()) {
    std::string names;
    for (const auto& a : archs) names += (names.empty() ? "" : ", ") + a;
    throw Error("synth: arch '" + s.arch + "' is not one it writes (" + names + ")");
  }
  if (s.rope_scaling != "none" && s.rope_scaling != "linear" && s.rope_scaling != "yarn" && s.rope_scaling != "freqs") {
    throw Error("synth: rope_scaling '" + s.rope_scaling + "' is not none, linear, yarn or freqs");
  }
  if (!(s.rope_factor >= 1) || !std::isfinite(s.rope_factor)) {
    throw Error("synth: rope_factor = " + std::to_string(s.rope_factor) + " must be a finite number >= 1");
  }
  range("head_dim", s.head_dim, 0);
  range("sliding_window", s.sliding_window, 0);
  if (s.head_dim == 0 && s.dim % s.n_heads != 0) {
    throw Error("synth: heads = " + std::to_string(s.n_heads) + " does not divide dim = " + std::to_string(s.dim));
  }
  if (s.n_heads % s.n_kv_heads != 0) {
    throw Error("synth: kv_heads = " + std::to_string(s.n_kv_heads) + " does not divide heads = " +
                std::to_string(s.n_heads));
  }
  if (synth_head_dim(s) % 2 != 0) {
    throw Error("synth: the head size " + std::to_string(synth_head_dim(s)) + " must be even for RoPE");
  }
  // Stored as float32 (as llama.cpp reads them): the value must stay positive and finite there.
  auto positive_float = [](const char* field, double v) {
    const auto stored = static_cast<float>(v);
    if (!(stored > 0) || !std::isfinite(stored)) {
      char shown[32];
      std::snprintf(shown, sizeof shown, "%g", v);
      throw Error("synth: " + std::string(field) + " = " + shown + " must be a positive number a float32 holds (" +
                  "about 1.2e-38 to 3.4e38)");
    }
  };
  positive_float("rope_theta", s.rope_theta);
  positive_float("rms_eps", s.rms_eps);
  if (file_type(s.dtype) == 0 && s.dtype != DType::F32) {
    throw Error("synth: dtype " + std::string(dtype_name(s.dtype)) +
                " is not supported (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, "
                "q5_k, q6_k, iq4_nl, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s)");
  }
  if (!s.recipe.empty() && synth_recipe_base(s.recipe) != s.dtype) {
    throw Error("synth: recipe " + s.recipe + " needs dtype " + std::string(dtype_name(synth_recipe_base(s.recipe))));
  }
}

double synth_parameter_count(const SynthSpec& s) {
  // In double: the fields' ranges allow shapes whose count overflows int64 (refused by check_space).
  const double dim = double(s.dim), hd = double(synth_head_dim(s));
  const double q_dim = hd * double(s.n_heads), kv_dim = hd * double(s.n_kv_heads);
  const double per_layer = 4 * dim + 2 * dim * q_dim + 2 * dim * kv_dim + 3 * dim * double(s.ffn_dim);
  return dim * double(s.vocab) * (synth_tied(s) ? 1 : 2) + double(s.n_layers) * per_layer + dim;
}

std::vector<std::string> synth_architectures() {
  return {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3"};
}

Vocabulary synth_vocabulary(int64_t size) {
  if (size < kMinVocab || size > kMaxDim) {
    throw Error("synth: vocab = " + std::to_string(size) + " is outside " + std::to_string(kMinVocab) + ".." +
                std::to_string(kMaxDim));
  }
  return build_vocabulary(size);
}

namespace {

// Refuses, before any work, a model the output's file system cannot hold (a mistyped --dim would
// otherwise fill the disk, or run for hours first).
void check_space(const SynthSpec& s, const std::string& path) {
  // Every matrix in the chosen type (one whose rows are not whole blocks is written in f32: more).
  const double need = synth_parameter_count(s) * double(dtype_block_bytes(s.dtype)) / double(dtype_block_elems(s.dtype));
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(path, ec).parent_path();
  const std::filesystem::space_info free = std::filesystem::space(dir, ec);
  if (!ec && need > double(free.available)) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%.3g", need);
    throw Error("synth: the model would take about " + std::string(shown) + " bytes, more than the " +
                std::to_string(free.available) + " bytes free in " + dir.string());
  }
}

}  // namespace

void write_synthetic_model(const SynthSpec& spec, const std::string& path) {
  // A real vocabulary's keys, copied as stored; its size decides the embedding rows.
  SynthSpec s = spec;
  std::shared_ptr<const GgufFile> vocab_file;
  if (!s.vocab_file.empty()) {
    vocab_file = GgufFile::open(s.vocab_file);
    s.vocab = int64_t(load_vocabulary(*vocab_file).tokens.size());
  }
  validate_synth_spec(s);
  check_space(s, path);
  const Vocabulary vocab = vocab_file != nullptr ? Vocabulary{} : synth_vocabulary(s.vocab);
  const int64_t head_dim = synth_head_dim(s);
  const int64_t q_dim = head_dim * s.n_heads, kv_dim = head_dim * s.n_kv_heads;
  const std::string a = s.arch + ".";

  GgufWriter w;
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", "tessera-synth-" + (s.preset.empty() ? std::string("custom") : s.preset));
  w.add_uint32("general.file_type", s.recipe.empty() ? file_type(s.dtype) : synth_recipe_file_type(s.recipe));
  w.add_uint32("general.quantization_version", 2);
  w.set_alignment(32);
  w.add_uint32(a + "vocab_size", static_cast<uint32_t>(s.vocab));
  w.add_uint32(a + "context_length", static_cast<uint32_t>(s.context_length));
  w.add_uint32(a + "embedding_length", static_cast<uint32_t>(s.dim));
  w.add_uint32(a + "feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  w.add_uint32(a + "block_count", static_cast<uint32_t>(s.n_layers));
  w.add_uint32(a + "attention.head_count", static_cast<uint32_t>(s.n_heads));
  w.add_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_kv_heads));
  if (s.head_dim > 0) {
    w.add_uint32(a + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.add_uint32(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  w.add_uint32(a + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.add_float32(a + "rope.freq_base", static_cast<float>(s.rope_theta));
  w.add_float32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(s.rms_eps));
  if (s.rope_scaling == "linear" || s.rope_scaling == "yarn") {
    w.add_string(a + "rope.scaling.type", s.rope_scaling);
    w.add_float32(a + "rope.scaling.factor", static_cast<float>(s.rope_factor));
    w.add_uint32(a + "rope.scaling.original_context_length",
                 static_cast<uint32_t>(std::max<double>(1, double(s.context_length) / s.rope_factor)));
  }
  const bool windowed = s.arch == "mistral" || s.arch == "gemma2" || s.arch == "gemma3";
  if (windowed && (s.sliding_window > 0 || s.arch != "mistral")) {
    w.add_uint32(a + "attention.sliding_window",
                 static_cast<uint32_t>(s.sliding_window > 0 ? s.sliding_window : std::max<int64_t>(1, s.context_length / 4)));
  }
  if (s.arch == "gemma2") {
    w.add_float32(a + "attn_logit_softcapping", 50.0f);
    w.add_float32(a + "final_logit_softcapping", 30.0f);
  }
  if (vocab_file != nullptr) {
    for (const auto& [key, value] : vocab_file->metadata()) {
      if (key.rfind("tokenizer.", 0) == 0) copy_value(w, key, value);
    }
  } else {
    w.add_string("tokenizer.ggml.model", vocab.model);
    w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
    w.add_float32_array("tokenizer.ggml.scores", vocab.scores);
    w.add_int32_array("tokenizer.ggml.token_type", vocab.types);
    w.add_uint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(vocab.unk));
    w.add_uint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.bos));
    w.add_uint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos));
    w.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
    w.add_bool("tokenizer.ggml.add_eos_token", false);
    w.add_bool("tokenizer.ggml.add_space_prefix", vocab.add_space_prefix);
  }

  // Scales keep activations O(1) (RMSNorm sees unit rows, linears with std 1/sqrt(fan_in) preserve
  // variance, norms are 1) and logits near unit spread. Embeddings have std 1; a tied head reads
  // them as its weights, so there they take 1/sqrt(dim): larger, and each token's own embedding
  // dominates its logits and greedy decoding repeats one token forever.
  // Gemma's embeddings are scaled by sqrt(dim) on the way in: stored at 1/sqrt(dim), they arrive
  // at unit spread.
  const uint64_t seed = s.seed;
  const bool tied = synth_tied(s);
  const float embed_std = tied ? 1.0f / std::sqrt(static_cast<float>(s.dim)) : 1.0f;
  auto matrix = [&](const std::string& name, int64_t in, int64_t out, float std_dev, DType want) {
    const DType dt = matrix_dtype(want, in);
    w.add_tensor(name, {in, out}, dt, [=](uint8_t* dst, size_t) {
      fill_gaussian(dst, out, in, dt, tensor_key(seed, name), std_dev);
    });
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    matrix(name, in, out, 1.0f / std::sqrt(static_cast<float>(in)), synth_tensor_dtype(s, name));
  };
  // A vector: `mean` + Gaussian noise of `spread` (llama keeps its norms at exactly 1, as before).
  auto vec = [&](const std::string& name, int64_t n, float mean, float spread) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * 4);
    if (spread > 0) fill_gaussian(bytes.data(), 1, n, DType::F32, tensor_key(seed, name), spread);
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      v = (spread > 0 ? v : 0.0f) + mean;
      std::memcpy(bytes.data() + i * 4, &v, 4);
    }
    w.add_tensor(name, {n}, DType::F32, std::move(bytes));
  };
  const float norm_spread = s.arch == "llama" || s.arch == "mistral" ? 0.0f : 0.1f;
  auto norm = [&](const std::string& name, int64_t n) { vec(name, n, 1.0f, norm_spread); };

  matrix("token_embd.weight", s.dim, s.vocab, embed_std, s.dtype);
  if (s.rope_scaling == "freqs") {  // Llama 3's shape of factors: 1 for high frequencies rising to rope_factor
    std::vector<uint8_t> bytes(static_cast<size_t>(head_dim / 2) * 4);
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const float f = 1.0f + float(s.rope_factor - 1) * float(i) / float(std::max<int64_t>(1, head_dim / 2 - 1));
      std::memcpy(bytes.data() + i * 4, &f, 4);
    }
    w.add_tensor("rope_freqs.weight", {head_dim / 2}, DType::F32, std::move(bytes));
  }
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    norm(p + "attn_norm.weight", s.dim);
    if (s.arch == "phi3") {
      linear(p + "attn_qkv.weight", s.dim, q_dim + 2 * kv_dim);
    } else {
      linear(p + "attn_q.weight", s.dim, q_dim);
      linear(p + "attn_k.weight", s.dim, kv_dim);
      linear(p + "attn_v.weight", s.dim, kv_dim);
    }
    if (s.arch == "qwen2") {
      vec(p + "attn_q.bias", q_dim, 0.0f, 0.5f);
      vec(p + "attn_k.bias", kv_dim, 0.0f, 0.5f);
      vec(p + "attn_v.bias", kv_dim, 0.0f, 0.5f);
    }
    if (s.arch == "qwen3" || s.arch == "gemma3") {
      norm(p + "attn_q_norm.weight", head_dim);
      norm(p + "attn_k_norm.weight", head_dim);
    }
    linear(p + "attn_output.weight", q_dim, s.dim);
    if (s.arch == "gemma2" || s.arch == "gemma3") norm(p + "post_attention_norm.weight", s.dim);
    norm(p + "ffn_norm.weight", s.dim);
    if (s.arch == "phi3") {
      linear(p + "ffn_up.weight", s.dim, 2 * s.ffn_dim);
    } else {
      linear(p + "ffn_gate.weight", s.dim, s.ffn_dim);
      linear(p + "ffn_up.weight", s.dim, s.ffn_dim);
    }
    linear(p + "ffn_down.weight", s.ffn_dim, s.dim);
    if (s.arch == "gemma2" || s.arch == "gemma3") norm(p + "post_ffw_norm.weight", s.dim);
  }
  norm("output_norm.weight", s.dim);
  if (!tied) linear("output.weight", s.dim, s.vocab);
  w.write(path);
}

}  // namespace tessera
