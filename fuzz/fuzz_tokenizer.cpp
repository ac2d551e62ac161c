// Tokenizers: SentencePiece and byte-level BPE (several pre-tokenizers) on the vocabularies of
// ../shared/vocab (TESSERA_FUZZ_VOCAB_DIR overrides the folder). The first byte picks the vocabulary
// and the flags, the second what to do: encode the rest as text (byte-level BPE must give UTF-8 text
// back from decode, as tokenizer.h promises) or decode it as token ids (an id outside the vocabulary
// throws tessera::Error naming it). A crash, another exception, a leak or undefined behaviour is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/tokenizer.h"

namespace {

std::vector<std::unique_ptr<tessera::Tokenizer>>& tokenizers() {
  static std::vector<std::unique_ptr<tessera::Tokenizer>> t;
  return t;
}

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c < 0xE0) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c < 0xF0) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c < 0xF5) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("TESSERA_FUZZ_VOCAB_DIR");
  const std::string dir = env != nullptr ? env : TESSERA_SHARED_DIR "/vocab";
  // SentencePiece (llama, phi-3) and byte-level BPE with four different pre-tokenizers.
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "falcon", "deepseek-llm", "starcoder"}) {
    const std::string path = dir + "/ggml-vocab-" + name + ".gguf";
    try {
      tokenizers().push_back(tessera::Tokenizer::create(tessera::load_vocabulary(*tessera::GgufFile::open(path))));
    } catch (const tessera::Error& e) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", e.what());
      std::abort();  // a missing vocabulary would make the run test nothing
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto& all = tokenizers();
  const tessera::Tokenizer& tok = *all[data[0] % all.size()];
  const bool add_special = (data[0] / all.size()) & 1;
  const bool parse_special = (data[0] / all.size()) & 2;
  const bool byte_level = tok.vocabulary().model == "gpt2";
  data += 2;
  size -= 2;
  if (data[-1] & 1) {
    // Token ids, 16 bits each, spread a little past both ends of the vocabulary.
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < size; i += 2) {
      const int32_t raw = int32_t(data[i]) | (int32_t(data[i + 1]) << 8);
      ids.push_back(raw % (tok.vocab_size() + 2) - 1);
    }
    bool in_range = true;
    for (int32_t id : ids) in_range = in_range && id >= 0 && id < tok.vocab_size();
    try {
      (void)tok.decode(ids);
      for (int32_t id : ids) (void)tok.token_to_piece(id);
      if (!in_range) __builtin_trap();  // an id outside the vocabulary must be refused
    } catch (const tessera::Error&) {
      if (in_range) __builtin_trap();
    }
    return 0;
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, add_special, parse_special);
  } catch (const tessera::Error&) {
    // By design: a byte the vocabulary has no token for, without <unk> (Falcon's has none for some
    // control bytes), is refused by name; llama.cpp drops it silently.
    return 0;
  }
  bool has_unk = false;  // a byte whose character the vocabulary lacks (StarCoder's 0xF1) is <unk>, as in HF
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
    (void)tok.token_to_piece(id);
    has_unk = has_unk || id == tok.vocabulary().unk;
  }
  const std::string back = tok.decode(ids);
  // Only for UTF-8: bytes that never occur in it (0xC0, 0xF8..0xFF) are byte-level characters that
  // some vocabularies also hold as added tokens (DeepSeek's "ÿ", "ø"...), which then decode as text,
  // as in llama.cpp.
  if (byte_level && !parse_special && !has_unk && valid_utf8(text) && back != text) __builtin_trap();
  return 0;
}
