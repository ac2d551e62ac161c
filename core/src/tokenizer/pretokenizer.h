// The pre-tokenizers of byte-level BPE vocabularies (tokenizer.ggml.pre): the regular expressions
// each model family's Hugging Face tokenizer.json publishes, which cut text into words before BPE
// merges them. Several families split in steps (each step cuts every piece of the one before).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer_detail {

class PreTokenizer {
 public:
  // Compiles the expressions of `name` once (JIT where PCRE2 has it). Throws Error naming the
  // pre-tokenizer and listing the supported ones when it is unknown.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` (views into it, in order, none empty, together all of it) to out.
  // Thread-safe: each call has its own match data.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  // Whether a word that is a whole vocabulary token is taken as it is, without merges (Llama 3's
  // tokenizer.json "ignore_merges": true).
  bool ignore_merges() const { return ignore_merges_; }
  const std::string& name() const { return name_; }

  // Every name the constructor accepts, in a stable order.
  static std::vector<std::string> supported();
  // Whether llama.cpp adds BOS for this pre-tokenizer's vocabularies when the file has no
  // tokenizer.ggml.add_bos_token (Llama 3, Tekken); false for unknown names.
  static bool adds_bos_by_default(std::string_view name);

 private:
  struct Step;
  std::string name_;
  std::vector<Step> steps_;
  bool ignore_merges_ = false;
};

}  // namespace tessera::tokenizer_detail
