// Vocabulary loading and the tokenizer factory; the algorithms live in tokenizer_<kind>.cpp.
#include "tessera/tokenizer.h"

#include <string>

#include "pretokenizer.h"
#include "tessera/error.h"
#include "tessera/gguf.h"

namespace tessera {

// Implementations, one file each.
std::unique_ptr<Tokenizer> create_spm_tokenizer(Vocabulary v);  // tokenizer_spm.cpp
std::unique_ptr<Tokenizer> create_bpe_tokenizer(Vocabulary v);  // tokenizer_bpe.cpp

namespace {

bool is_byte_token_text(std::string_view s) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
  return s.size() == 6 && s.substr(0, 3) == "<0x" && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

// Reads a special token id; -1 (or uint32 0xFFFFFFFF, as some converters write) means "none".
int32_t read_special_id(const GgufFile& f, std::string_view key, int32_t fallback, size_t n_tokens) {
  if (f.find(key) == nullptr) return fallback < static_cast<int64_t>(n_tokens) ? fallback : -1;
  const int64_t id = f.get_int(key);
  if (id == -1 || id == 0xFFFFFFFFll) return -1;
  if (id < 0 || id >= static_cast<int64_t>(n_tokens)) {
    throw Error(f.path() + ": metadata key '" + std::string(key) + "' = " + std::to_string(id) +
                " is outside the vocabulary (" + std::to_string(n_tokens) + " tokens)");
  }
  return static_cast<int32_t>(id);
}

}  // namespace

Vocabulary load_vocabulary(const GgufFile& f) {
  Vocabulary v;
  if (f.find("tokenizer.ggml.model") == nullptr || f.find("tokenizer.ggml.tokens") == nullptr) {
    throw Error(f.path() + ": the file has no tokenizer (tokenizer.ggml.model and tokenizer.ggml.tokens are required)");
  }
  v.model = f.get_string("tokenizer.ggml.model");
  if (f.find("tokenizer.ggml.pre")) v.pre = f.get_string("tokenizer.ggml.pre");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  if (n == 0) throw Error(f.path() + ": tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) throw Error(f.path() + ": tokenizer.ggml.tokens has too many entries");

  auto check_len = [&](std::string_view key, size_t got) {
    if (got != n) {
      throw Error(f.path() + ": metadata key '" + std::string(key) + "' has " + std::to_string(got) +
                  " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
  };
  if (f.find("tokenizer.ggml.scores")) {
    v.scores = f.get_float_array("tokenizer.ggml.scores");
    check_len("tokenizer.ggml.scores", v.scores.size());
  }
  if (f.find("tokenizer.ggml.token_type")) {
    v.types = f.get_int_array("tokenizer.ggml.token_type");
    check_len("tokenizer.ggml.token_type", v.types.size());
  }
  if (f.find("tokenizer.ggml.merges")) v.merges = f.get_string_array("tokenizer.ggml.merges");

  // llama.cpp's defaults for SentencePiece vocabularies that omit the ids: <unk>=0, <s>=1, </s>=2.
  const bool spm = v.model == "llama";
  v.bos = read_special_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
  v.eos = read_special_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
  v.unk = read_special_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
  v.pad = read_special_id(f, "tokenizer.ggml.padding_token_id", -1, n);
  // Without the key, llama.cpp adds BOS for SentencePiece vocabularies and, of the byte-level ones,
  // only for those whose pre-tokenizer says so (Llama 3, Tekken); GPT-2, Qwen2, Falcon, StarCoder...
  // get none. (Its gpt2 default of bos = eos = 11, Falcon's <|endoftext|>, is not copied: an absent id
  // stays -1 here.)
  const bool bos_default = spm || (v.model == "gpt2" && tokenizer_detail::PreTokenizer::adds_bos_by_default(v.pre));
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", bos_default);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", spm);
  return v;
}

Tokenizer::Tokenizer(Vocabulary v) : vocab_(std::move(v)) {
  const size_t n = vocab_.tokens.size();
  if (n == 0) throw Error("tokenizer: the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) throw Error("tokenizer: the vocabulary is too large");
  if (vocab_.scores.empty()) vocab_.scores.assign(n, 0.0f);
  if (vocab_.types.empty()) {
    vocab_.types.resize(n);
    for (size_t i = 0; i < n; ++i) vocab_.types[i] = is_byte_token_text(vocab_.tokens[i]) ? kTokenByte : kTokenNormal;
  }
  if (vocab_.scores.size() != n || vocab_.types.size() != n) {
    throw Error("tokenizer: " + std::to_string(n) + " tokens but " + std::to_string(vocab_.scores.size()) +
                " scores and " + std::to_string(vocab_.types.size()) + " token types");
  }
  for (auto [name, id] : {std::pair{"bos", vocab_.bos}, {"eos", vocab_.eos}, {"unk", vocab_.unk}, {"pad", vocab_.pad}}) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      throw Error(std::string("tokenizer: ") + name + " id " + std::to_string(id) + " is outside the vocabulary (" +
                  std::to_string(n) + " tokens)");
    }
  }
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(vocab_size()) + " tokens)");
  }
}

std::unique_ptr<Tokenizer> Tokenizer::create(Vocabulary v) {
  if (v.model == "llama") return create_spm_tokenizer(std::move(v));
  if (v.model == "gpt2") return create_bpe_tokenizer(std::move(v));
  throw Error("tokenizer model '" + v.model + "' is not supported (supported: llama, gpt2)");
}

}  // namespace tessera
