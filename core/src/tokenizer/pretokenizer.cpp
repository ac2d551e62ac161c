// Pre-tokenizer expressions per family, run with PCRE2 (UTF + UCP, so \p{L}, \s and case folding are
// Unicode's, as in the Oniguruma expressions of Hugging Face tokenizers). Invalid UTF-8 is matched
// by nothing (PCRE2_MATCH_INVALID_UTF): it ends up in the pieces between matches, whole, so byte-level
// BPE still encodes every byte.
#include "pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "tessera/error.h"

namespace tessera::tokenizer_detail {

namespace {

// GPT-2's (the ByteLevel pre-tokenizer's default expression).
constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (cl100k-style: case-insensitive contractions, digits in threes, newlines kept together).
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's with single digits.
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o (o200k): words split at case changes, contractions attached.
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's Tekken: o200k's words without the contractions, single digits.
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Hugging Face's Punctuation pre-tokenizer (contiguous): Unicode punctuation and the ASCII
// punctuation characters Unicode calls symbols.
constexpr std::string_view kPunctuation = R"([\p{P}$+<=>^`|~]+)";
// CJK ideographs (and the ranges below them), Hangul.
constexpr std::string_view kCjk = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";

// A step: an expression whose matches and the text between them become pieces (Hugging Face's
// Split with behaviour "Isolated"), or Falcon's digit split (see falcon_digits).
struct StepSpec {
  enum Kind { kRegex, kFalconDigits } kind;
  std::string_view pattern;
};

struct Family {
  std::vector<std::string_view> names;
  std::vector<StepSpec> steps;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's add_bos when the file does not say
};

StepSpec re(std::string_view p) { return {StepSpec::kRegex, p}; }

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      // A file without tokenizer.ggml.pre: the ByteLevel default (GPT-2's expression).
      {{"default", "gpt-2", "gpt2", "mpt", "gpt-neox", "olmo", "phi-2"}, {re(kGpt2)}},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3"}, {re(kLlama3)}, true, true},
      {{"dbrx", "smaug-bpe"}, {re(kLlama3)}},
      {{"qwen2", "stablelm2"}, {re(kQwen2)}},
      // Digits one by one first (Hugging Face's Digits(individual_digits)), then GPT-2's expression.
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {re(R"(\p{N})"), re(kGpt2)}},
      // Punctuation, GPT-2's expression, then (after the byte mapping) digit runs, cut in threes.
      {{"falcon"}, {re(kPunctuation), re(kGpt2), {StepSpec::kFalconDigits, {}}, re("[0-9][0-9][0-9]")}},
      {{"deepseek-llm"},
       {re(R"([\r\n])"), re(R"(\s?\p{L&}+)"), re("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"),
        re(R"(\s+$)"), re(kCjk), re(R"(\p{N}+)")}},
      {{"deepseek-coder"}, {re(R"([\r\n])"), re(R"(\s?\p{L}+)"), re(R"(\s?\p{P}+)"), re(kCjk), re(R"(\p{N})")}},
      {{"gpt-4o"}, {re(kGpt4o)}},
      {{"tekken"}, {re(kTekken)}, true, true},
  };
  return f;
}

const Family* find_family(std::string_view name) {
  for (const Family& fam : families()) {
    if (std::find(fam.names.begin(), fam.names.end(), name) != fam.names.end()) return &fam;
  }
  return nullptr;
}

// Falcon's Digits(individual_digits = false) runs after the ByteLevel step, on the byte-mapped
// text, where a byte is "numeric" when its stand-in character is: the ASCII digits and the bytes
// whose Latin-1 characters are ², ³, ¹, ¼, ½, ¾ (so it may cut inside a UTF-8 character; BPE works
// on bytes, so that only moves word boundaries, as it does in Hugging Face's tokenizer).
bool falcon_numeric(unsigned char b) {
  return (b >= '0' && b <= '9') || b == 0xB2 || b == 0xB3 || b == 0xB9 || b == 0xBC || b == 0xBD || b == 0xBE;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

struct PreTokenizer::Step {
  struct Free {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  StepSpec::Kind kind = StepSpec::kRegex;
  std::unique_ptr<pcre2_code, Free> code;
};

PreTokenizer::PreTokenizer(std::string_view name) : name_(name) {
  const Family* fam = find_family(name);
  if (fam == nullptr) {
    std::string list;
    for (const std::string& n : supported()) list += (list.empty() ? "" : ", ") + n;
    throw Error("tokenizer: pre-tokenizer '" + std::string(name) + "' (tokenizer.ggml.pre) is not supported (supported: " +
                list + ")");
  }
  ignore_merges_ = fam->ignore_merges;
  steps_.reserve(fam->steps.size());
  for (const StepSpec& spec : fam->steps) {
    Step step;
    step.kind = spec.kind;
    if (spec.kind == StepSpec::kRegex) {
      int err = 0;
      PCRE2_SIZE err_at = 0;
      step.code.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spec.pattern.data()), spec.pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_at, nullptr));
      if (step.code == nullptr) {
        throw Error("tokenizer: pre-tokenizer '" + name_ + "': expression '" + std::string(spec.pattern) +
                    "' does not compile at offset " + std::to_string(err_at) + ": " + pcre2_message(err));
      }
      // JIT where this PCRE2 has it; the interpreter gives the same matches otherwise.
      (void)pcre2_jit_compile(step.code.get(), PCRE2_JIT_COMPLETE);
    }
    steps_.push_back(std::move(step));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text}, next;
  pcre2_match_data* md = nullptr;
  struct FreeMd {
    pcre2_match_data*& md;
    ~FreeMd() { pcre2_match_data_free(md); }
  } free_md{md};

  for (const Step& step : steps_) {
    next.clear();
    if (step.kind == StepSpec::kFalconDigits) {
      for (const std::string_view p : pieces) {
        size_t start = 0;
        for (size_t i = 1; i <= p.size(); ++i) {
          if (i == p.size() || falcon_numeric(p[i]) != falcon_numeric(p[i - 1])) {
            next.push_back(p.substr(start, i - start));
            start = i;
          }
        }
      }
      pieces.swap(next);
      continue;
    }
    if (md == nullptr) md = pcre2_match_data_create(4, nullptr);
    if (md == nullptr) throw Error("tokenizer: out of memory for PCRE2 match data");
    for (const std::string_view p : pieces) {
      const auto subject = reinterpret_cast<PCRE2_SPTR>(p.data());
      size_t last = 0;  // end of the last match: text from here to the next match is a piece too
      size_t at = 0;
      while (at < p.size()) {
        int rc = pcre2_match(step.code.get(), subject, p.size(), at, 0, md, nullptr);
        // The JIT's stack is small; a long run of one class can exhaust it. The interpreter keeps
        // its backtracking on the heap.
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(step.code.get(), subject, p.size(), at, PCRE2_NO_JIT, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          throw Error("tokenizer: pre-tokenizer '" + name_ + "' failed on a text of " + std::to_string(p.size()) +
                      " bytes: " + pcre2_message(rc));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {  // no expression matches empty text, but never loop on one that would
          at = begin + 1;
          continue;
        }
        if (begin > last) next.push_back(p.substr(last, begin - last));
        next.push_back(p.substr(begin, end - begin));
        last = at = end;
      }
      if (last < p.size()) next.push_back(p.substr(last));
    }
    pieces.swap(next);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

std::vector<std::string> PreTokenizer::supported() {
  std::vector<std::string> names;
  for (const Family& fam : families()) names.insert(names.end(), fam.names.begin(), fam.names.end());
  return names;
}

bool PreTokenizer::adds_bos_by_default(std::string_view name) {
  const Family* fam = find_family(name);
  return fam != nullptr && fam->add_bos;
}

}  // namespace tessera::tokenizer_detail
