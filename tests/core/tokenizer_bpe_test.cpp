// Byte-level BPE pieces without a real vocabulary: each family's pre-tokenizer splits (white-box,
// through the internal header), merge order, Llama 3's ignore_merges, the byte alphabet, and the
// add_bos defaults load_vocabulary takes from llama.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../core/src/tokenizer/pretokenizer.h"  // internal: the splits are not visible through encode
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

using tokenizer_detail::PreTokenizer;

std::vector<std::string> split(std::string_view pre, std::string_view text) {
  std::vector<std::string_view> words;
  PreTokenizer(pre).split(text, words);
  return {words.begin(), words.end()};
}
using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(split("gpt-2", "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("gpt-2", "Hello  world  "), (Words{"Hello", " ", " world", "  "}));
  EXPECT_EQ(split("gpt-2", "I'm HERE'S"), (Words{"I", "'m", " HERE", "'", "S"}));  // contractions: lower case only
  EXPECT_EQ(split("gpt-2", "1234567 x2"), (Words{"1234567", " x", "2"}));
  EXPECT_EQ(split("gpt-2", "a\n\nb"), (Words{"a", "\n", "\n", "b"}));  // the last space joins what follows, or stands alone
  EXPECT_EQ(split("gpt-2", "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC!!"), (Words{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC", "!!"}));
  EXPECT_EQ(split("mpt", "Hello world"), split("gpt-2", "Hello world"));
  EXPECT_EQ(split("gpt-neox", "I'm"), (Words{"I", "'m"}));
  EXPECT_TRUE(split("gpt-2", "").empty());
}

TEST(PreTokenizer, Llama3) {
  EXPECT_EQ(split("llama-bpe", "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("llama-bpe", "I'm HERE'S"), (Words{"I", "'m", " HERE", "'S"}));  // case-insensitive
  EXPECT_EQ(split("llama-bpe", "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(split("llama-bpe", "x  \n  y"), (Words{"x", "  \n", " ", " y"}));
  EXPECT_EQ(split("llama-bpe", "hello, world!\n"), (Words{"hello", ",", " world", "!\n"}));
  EXPECT_EQ(split("llama-bpe", "\xF0\x9F\xA6\x99.cpp"), (Words{"\xF0\x9F\xA6\x99.", "cpp"}));
  EXPECT_EQ(split("llama-bpe", "(hello)"), (Words{"(hello", ")"}));  // one non-letter joins the word
  EXPECT_EQ(split("llama3", "ab"), split("llama-bpe", "ab"));
  EXPECT_TRUE(PreTokenizer("llama-bpe").ignore_merges());
  EXPECT_FALSE(PreTokenizer("gpt-2").ignore_merges());
}

TEST(PreTokenizer, Qwen2SingleDigits) {
  EXPECT_EQ(split("qwen2", "1234 I'M"), (Words{"1", "2", "3", "4", " I", "'M"}));
  EXPECT_EQ(split("qwen2", "x  \n  y"), (Words{"x", "  \n", " ", " y"}));
}

TEST(PreTokenizer, DigitsFirst) {
  // StarCoder, SmolLM, Command-R: every digit alone, then GPT-2's expression on the rest.
  for (const char* pre : {"starcoder", "smollm", "command-r"}) {
    EXPECT_EQ(split(pre, "abc123 x 45"), (Words{"abc", "1", "2", "3", " x", " ", "4", "5"})) << pre;
  }
}

TEST(PreTokenizer, Falcon) {
  // Punctuation runs first (with ASCII symbols), digits apart from the space before them, threes.
  EXPECT_EQ(split("falcon", "Hello, world!! 1234567"), (Words{"Hello", ",", " world", "!!", " ", "123", "456", "7"}));
  EXPECT_EQ(split("falcon", "a+=b"), (Words{"a", "+=", "b"}));
}

TEST(PreTokenizer, DeepSeek) {
  EXPECT_EQ(split("deepseek-coder", "foo(1)\n"), (Words{"foo", "(", "1", ")", "\n"}));
  EXPECT_EQ(split("deepseek-coder", "x 12"), (Words{"x", " ", "1", "2"}));
  EXPECT_EQ(split("deepseek-llm", "Hello, \xE4\xB8\xAD\xE6\x96\x87 42\n"),
            (Words{"Hello", ",", " ", "\xE4\xB8\xAD\xE6\x96\x87", " ", "42", "\n"}));
}

TEST(PreTokenizer, CaseSplitting) {
  EXPECT_EQ(split("gpt-4o", "HelloWorld don't 12345"), (Words{"Hello", "World", " don't", " ", "123", "45"}));
  EXPECT_EQ(split("tekken", "HelloWorld 12"), (Words{"Hello", "World", " ", "1", "2"}));
}

TEST(PreTokenizer, InvalidUtf8StaysWhole) {
  // Bytes that are no UTF-8 match nothing: they stay in the pieces between matches, none lost.
  const std::string text = "ab\xFF\xFE cd \x80";
  for (const std::string& pre : PreTokenizer::supported()) {
    std::string joined;
    for (const std::string& w : split(pre, text)) joined += w;
    EXPECT_EQ(joined, text) << pre;
  }
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheStack) {
  const std::string spaces(200000, ' ');
  const std::string text = "a" + spaces + "b" + std::string(100000, '\n') + std::string(100000, 'x');
  for (const std::string& pre : PreTokenizer::supported()) {
    std::string joined;
    for (const std::string& w : split(pre, text)) joined += w;
    EXPECT_EQ(joined, text) << pre;
  }
}

// A byte-level vocabulary: ids 0..255 are the bytes' characters (GPT-2's alphabet), then `extra`.
Vocabulary byte_vocab(const std::string& pre, const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  Vocabulary v;
  v.model = "gpt2";
  v.pre = pre;
  v.add_bos = false;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : next++;
    std::string ch;
    if (cp < 0x80) {
      ch += static_cast<char>(cp);
    } else {
      ch += static_cast<char>(0xC0 | (cp >> 6));
      ch += static_cast<char>(0x80 | (cp & 0x3F));
    }
    v.tokens.push_back(ch);
  }
  v.tokens.insert(v.tokens.end(), extra.begin(), extra.end());
  v.merges = merges;
  return v;
}

TEST(BpeMerges, LowestRankFirstThenLeftmost) {
  // 256 "ab", 257 "bc", 258 "abc"
  Vocabulary v = byte_vocab("gpt-2", {"ab", "bc", "abc", "cab"}, {"b c", "a b", "a bc", "c ab"});
  auto t = Tokenizer::create(v);
  EXPECT_EQ(t->encode("abc", false), (std::vector<int32_t>{258}));  // "b c" (rank 0) before "a b", then "a bc"
  EXPECT_EQ(t->encode("cab", false), (std::vector<int32_t>{259}));
  EXPECT_EQ(t->encode("abab", false), (std::vector<int32_t>{256, 256}));
  // Ties between equal pairs: the leftmost merges first ("bcbc" -> bc bc).
  EXPECT_EQ(t->encode("bcbc", false), (std::vector<int32_t>{257, 257}));
  // A space is 'Ġ' (U+0120), byte 0x20's stand-in: with no merges every byte is its own token.
  EXPECT_EQ(t->encode(" a\n", false), (std::vector<int32_t>{0x20, 'a', 0x0A}));
  EXPECT_EQ(t->vocabulary().tokens[0x20], "\xC4\xA0");
  EXPECT_EQ(t->token_to_piece(0x20), " ");
  EXPECT_EQ(t->token_to_piece(0xFF), "\xFF");
  EXPECT_EQ(t->decode(std::vector<int32_t>{0xE6, 0x97, 0xA5}), "\xE6\x97\xA5");
}

TEST(BpeMerges, IgnoreMergesTakesWholeWords) {
  // "abc" is a token no merge reaches ("a b" only): Llama 3 takes the word whole, GPT-2 merges.
  const std::vector<std::string> extra = {"ab", "abc"};
  EXPECT_EQ(Tokenizer::create(byte_vocab("gpt-2", extra, {"a b"}))->encode("abc", false), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(Tokenizer::create(byte_vocab("llama-bpe", extra, {"a b"}))->encode("abc", false),
            (std::vector<int32_t>{257}));
}

TEST(BpeMerges, BadMergeRefused) {
  EXPECT_THROW(Tokenizer::create(byte_vocab("gpt-2", {}, {"ab"})), Error);
}

// load_vocabulary's add_bos when the file has no tokenizer.ggml.add_bos_token: llama.cpp's.
TEST(BpeVocabularyFile, AddBosDefaults) {
  test::TempDir dir;
  auto write = [&](const std::string& pre, int add_bos) {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
    const Vocabulary v = byte_vocab(pre, {"<|bos|>"}, {});
    w.add_string_array("tokenizer.ggml.tokens", v.tokens);
    w.add_uint32("tokenizer.ggml.bos_token_id", 256);
    if (add_bos >= 0) w.add_bool("tokenizer.ggml.add_bos_token", add_bos != 0);
    const std::string path = dir.path() + "/v.gguf";
    w.write(path);
    return load_vocabulary(*GgufFile::open(path));
  };
  EXPECT_TRUE(write("llama-bpe", -1).add_bos);
  EXPECT_FALSE(write("qwen2", -1).add_bos);
  EXPECT_FALSE(write("gpt-2", -1).add_bos);
  EXPECT_FALSE(write("", -1).add_bos);
  EXPECT_TRUE(write("qwen2", 1).add_bos);
  EXPECT_FALSE(write("llama-bpe", 0).add_bos);
  const Vocabulary v = write("", -1);
  EXPECT_EQ(v.pre, "");
  EXPECT_EQ(v.bos, 256);
  EXPECT_EQ(v.eos, -1);
  // An absent pre is the ByteLevel default (GPT-2's expression).
  EXPECT_EQ(Tokenizer::create(v)->encode(" a", true), (std::vector<int32_t>{0x20, 'a'}));
}

}  // namespace
}  // namespace tessera
