// Text <-> token ids. The vocabulary comes from a GGUF file's tokenizer.ggml.* keys; the algorithm is
// picked by tokenizer.ggml.model. Only "llama" (SentencePiece BPE) exists today; a byte-level BPE
// ("gpt2") would be one more implementation file behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class GgufFile;

// SentencePiece / llama.cpp token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
  kTokenUndefined = 0,
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

struct Vocabulary {
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece BPE) or later "gpt2"
  std::vector<std::string> tokens;
  std::vector<float> scores;     // empty = all 0
  std::vector<int32_t> types;    // empty = inferred (BYTE for "<0xNN>", NORMAL otherwise)
  std::vector<std::string> merges;
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;
};

// Reads tokenizer.ggml.{model, tokens, scores, token_type, merges, bos_token_id, eos_token_id,
// unknown_token_id, padding_token_id, add_bos_token, add_eos_token, add_space_prefix}. Throws Error when tokens are
// missing, arrays disagree in length, or a special id is outside the vocabulary.
Vocabulary load_vocabulary(const GgufFile& f);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, as llama.cpp's llama_tokenize(parse_special = false): user-defined tokens
  // (TokenType 4) match as whole tokens, control tokens' texts ("<s>") are plain text. With
  // add_special, BOS first and EOS last where the vocabulary asks for them (add_bos, add_eos).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  // Text of a sequence. The space that encode puts in front of the text is removed after BOS, so
  // decode(encode(x, true)) == x where the vocabulary adds BOS and x holds no user-defined token
  // (the text after one keeps the space encode put before it, as in llama.cpp); a completion
  // decoded alone (no BOS) keeps its leading space, as it continues a prompt.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Raw bytes of one token: byte tokens give their byte, U+2581 becomes a space, control tokens
  // give "". Concatenating pieces (e.g. when streaming) yields valid UTF-8 once all bytes arrive.
  virtual std::string token_to_piece(int32_t id) const = 0;

  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  const Vocabulary& vocabulary() const { return vocab_; }

  // Picks the implementation by v.model ("llama"); throws Error for any other model.
  static std::unique_ptr<Tokenizer> create(Vocabulary v);

 protected:
  // Validates sizes and ids, fills empty scores/types.
  explicit Tokenizer(Vocabulary v);
  // Throws Error naming the id when it is outside the vocabulary.
  void check_id(int32_t id) const;

  Vocabulary vocab_;
};

}  // namespace tessera
