// SentencePiece-BPE tokenizer against llama.cpp's tokenization of the golden prompts, round trips,
// and vocabulary loading errors.
#include "tessera/tokenizer.h"

#include "test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/gguf.h"

namespace tessera {
namespace {

const std::string kShared = TESSERA_SHARED_DIR;
const std::string kStories = kShared + "/models/stories260K/stories260K-f32.gguf";
const std::string kAidreams = kShared + "/models/aidreams260K/aidreams260K-f32.gguf";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::unique_ptr<Tokenizer> load(const std::string& path) {
  return Tokenizer::create(load_vocabulary(*GgufFile::open(path)));
}

const Tokenizer& stories() {
  static const std::unique_ptr<Tokenizer> t = load(kStories);
  return *t;
}

// Strings whose round trip is easy to get wrong: spaces at the edges and in runs, newlines,
// multi-byte UTF-8 (tokens exist only for some), emoji, control bytes, invalid UTF-8.
const std::vector<std::string> kTricky = {
    "",
    " ",
    "  ",
    "a",
    " leading space",
    "trailing space ",
    "many    inner   spaces",
    "\n",
    "\n\nstarts with newlines",
    "line one\nline two\n\n  indented\n",
    "tab\tand\r\nCRLF",
    "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
    "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 ok \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
    std::string("nul\0byte", 8),
    "invalid \xFF\xFE utf8 \x80 \xE2\x96",
    "\"Quotes,\" she said. It's 3:45 -- okay?!",
    "Once upon a time, there was a little girl named Lily.",
};

TEST(TokenizerTest, LoadsVocabulary) {
  const Vocabulary v = load_vocabulary(*GgufFile::open(kStories));
  EXPECT_EQ(v.model, "llama");
  ASSERT_EQ(v.tokens.size(), 512u);
  EXPECT_EQ(v.scores.size(), 512u);
  EXPECT_EQ(v.types.size(), 512u);
  EXPECT_TRUE(v.merges.empty());
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.pad, -1);
  EXPECT_TRUE(v.add_bos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.tokens[258], "<0xFF>");
  EXPECT_EQ(v.tokens[259], "\xE2\x96\x81t");  // "▁t"
  EXPECT_EQ(v.types[0], kTokenUnknown);
  EXPECT_EQ(v.types[1], kTokenControl);
  EXPECT_EQ(v.types[13], kTokenByte);
  EXPECT_EQ(v.types[300], kTokenNormal);
  EXPECT_GT(v.scores[259], v.scores[300]);  // score = -rank
  const Tokenizer& t = stories();
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_EQ(t.vocabulary().tokens[261], "\xE2\x96\x81" "a");
}

TEST(TokenizerTest, OnceUponATime) {
  EXPECT_EQ(stories().encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(stories().encode("Once upon a time", false), (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(stories().decode(std::vector<int32_t>{1, 403, 407, 261, 378}), "Once upon a time");
}

TEST(TokenizerTest, GoldenPromptsMatchLlamaCpp) {
  const auto golden = nlohmann::json::parse(read_all(kShared + "/golden/stories260K-f32.greedy96.json"));
  ASSERT_GE(golden.size(), 5u);
  for (const auto& entry : golden) {
    const std::string prompt = entry.at("prompt").get<std::string>();
    const auto want = entry.at("prompt_token_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(stories().encode(prompt, true), want) << prompt;
    EXPECT_EQ(stories().decode(want), prompt);
    // completion_text is the completion's pieces concatenated (no space stripping mid-text).
    const auto completion = entry.at("completion_token_ids").get<std::vector<int32_t>>();
    std::string pieces;
    for (int32_t id : completion) pieces += stories().token_to_piece(id);
    EXPECT_EQ(pieces, entry.at("completion_text").get<std::string>()) << prompt;
  }
}

TEST(TokenizerTest, NewlinesAreByteTokens) {
  const std::vector<int32_t> ids = stories().encode("Hi.\nBye.", true);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 13), ids.end());  // <0x0A> = 3 + 10
  EXPECT_EQ(stories().decode(ids), "Hi.\nBye.");
}

TEST(TokenizerTest, EvalTextRoundTrip) {
  const std::string text = read_all(kShared + "/eval/tiny_stories_eval.txt");
  ASSERT_FALSE(text.empty());
  const std::vector<int32_t> ids = stories().encode(text, true);
  EXPECT_EQ(ids.size(), 1116u);  // golden/README.md: 1,116 tokens with BOS
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(stories().decode(ids), text);
}

TEST(TokenizerTest, TrickyStringsRoundTrip) {
  for (const std::string& s : kTricky) {
    const std::vector<int32_t> ids = stories().encode(s, true);
    EXPECT_EQ(stories().decode(ids), s) << "'" << s << "'";
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 512);
    }
  }
  EXPECT_EQ(stories().encode("", true), (std::vector<int32_t>{1}));
  EXPECT_TRUE(stories().encode("", false).empty());
  // An emoji has no token: its four UTF-8 bytes become four byte tokens.
  const std::vector<int32_t> ids = stories().encode("\xF0\x9F\x98\x80", false);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 4, ids.end()), (std::vector<int32_t>{3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
}

TEST(TokenizerTest, RandomBytesRoundTrip) {
  // Arbitrary bytes, biased towards spaces, newlines and UTF-8 lead/continuation bytes.
  std::mt19937 rng(1234);
  const std::string alphabet = std::string("  \n\n\tab.") + "\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80\xFF\x80";
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = rng() % 3 == 0 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    // A literal U+2581 in the input decodes as a space (inherent to SentencePiece); skip those.
    if (s.find("\xE2\x96\x81") != std::string::npos) continue;
    EXPECT_EQ(stories().decode(stories().encode(s, true)), s) << testing::PrintToString(s);
  }
}

TEST(TokenizerTest, LongInputIsFast) {
  // A priority-queue merge handles 200 KB quickly; an O(n^2) scan would take far longer.
  std::string text;
  const std::string eval = read_all(kShared + "/eval/tiny_stories_eval.txt");
  while (text.size() < 200000) text += eval;
  const std::vector<int32_t> ids = stories().encode(text, true);
  EXPECT_EQ(stories().decode(ids), text);
  // A single 100 KB word without spaces is the worst case for merging.
  const std::string word(100000, 'a');
  EXPECT_EQ(stories().decode(stories().encode(word, true)), word);
}

TEST(TokenizerTest, TokenToPiece) {
  const Tokenizer& t = stories();
  EXPECT_EQ(t.token_to_piece(1), "");  // control
  EXPECT_EQ(t.token_to_piece(2), "");
  EXPECT_EQ(t.token_to_piece(13), "\n");
  EXPECT_EQ(t.token_to_piece(3), std::string(1, '\0'));
  EXPECT_EQ(t.token_to_piece(258), "\xFF");
  EXPECT_EQ(t.token_to_piece(259), " t");  // U+2581 becomes a space
  EXPECT_EQ(t.token_to_piece(261), " a");
  EXPECT_EQ(t.token_to_piece(260), "he");
  EXPECT_EQ(t.token_to_piece(0), "\xE2\x96\x85");  // <unk>, shown as llama.cpp does
  EXPECT_THROW(t.token_to_piece(512), Error);
  EXPECT_THROW(t.token_to_piece(-1), Error);
  EXPECT_THROW(t.decode(std::vector<int32_t>{1, 600}), Error);
  // Byte tokens of one character reassemble into UTF-8 when decoded together.
  EXPECT_EQ(t.decode(std::vector<int32_t>{3 + 0xE2, 3 + 0x82, 3 + 0xAC}), "\xE2\x82\xAC");
  // Only the space encode adds after BOS is stripped; a completion keeps its leading space.
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 259, 259}), "t t");
  EXPECT_EQ(t.decode(std::vector<int32_t>{259, 259}), " t t");
}

TEST(TokenizerTest, AidreamsVocabulary) {
  const auto t = load(kAidreams);
  const Vocabulary& v = t->vocabulary();
  ASSERT_EQ(t->vocab_size(), 512);
  EXPECT_EQ(t->bos(), 1);
  // Its own vocabulary: the merges differ from stories260K's after the 259 specials and bytes.
  int same = 0;
  for (int i = 259; i < 512; ++i) same += v.tokens[i] == stories().vocabulary().tokens[i];
  EXPECT_LT(same, 100);
  const std::string text = read_all(kShared + "/eval/tiny_stories_eval.txt");
  EXPECT_EQ(t->decode(t->encode(text, true)), text);
  EXPECT_NE(t->encode(text, true), stories().encode(text, true));
  for (const std::string& s : kTricky) EXPECT_EQ(t->decode(t->encode(s, true)), s) << s;
}

Vocabulary toy_vocab() {
  Vocabulary v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "ba", "abc"};
  v.scores = {0, 0, 0, 0, 0, 0, 1, 1, 5};
  v.types = {kTokenUnknown, kTokenControl, kTokenControl, 1, 1, 1, 1, 1, 1};
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_space_prefix = false;
  return v;
}

TEST(TokenizerTest, MergeOrderAndFallbacks) {
  {  // Equal scores: the leftmost pair merges first.
    const auto t = Tokenizer::create(toy_vocab());
    EXPECT_EQ(t->encode("aba", false), (std::vector<int32_t>{6, 3}));
    // "abc" needs "ab" first, then "ab"+"c".
    EXPECT_EQ(t->encode("abc", false), (std::vector<int32_t>{8}));
    // No byte tokens: an unknown character becomes <unk>.
    EXPECT_EQ(t->encode("axb", false), (std::vector<int32_t>{3, 0, 4}));
    EXPECT_EQ(t->encode("a\xC3\xA9", false), (std::vector<int32_t>{3, 0}));  // one <unk> per character
  }
  {  // A higher score wins over position.
    Vocabulary v = toy_vocab();
    v.scores[7] = 2;  // "ba"
    EXPECT_EQ(Tokenizer::create(v)->encode("aba", false), (std::vector<int32_t>{3, 7}));
  }
  {  // Without <unk> or byte tokens an unknown character cannot be encoded.
    Vocabulary v = toy_vocab();
    v.unk = -1;
    EXPECT_THROW(Tokenizer::create(v)->encode("x", false), Error);
  }
  {  // Missing scores/types are filled in; "<0xNN>" tokens are recognised as bytes.
    Vocabulary v;
    v.model = "llama";
    v.tokens = {"<0x41>", "<0x42>", "\xE2\x96\x81"};
    v.add_space_prefix = true;
    const auto t = Tokenizer::create(v);
    EXPECT_EQ(t->encode("A B", false), (std::vector<int32_t>{2, 0, 2, 1}));
    EXPECT_EQ(t->decode(std::vector<int32_t>{2, 0, 2, 1}), " A B");  // no BOS: the prefix space stays
  }
}

// User-defined tokens (added pieces such as "<|user|>") are matched whole, longest first, and the text
// after one takes the space prefix again, as llama.cpp's llama_tokenize does; the special flag adds
// BOS and EOS where the vocabulary asks for them.
TEST(TokenizerTest, UserDefinedTokensAndTheVocabularysBosAndEos) {
  Vocabulary v = load_vocabulary(*GgufFile::open(kStories));
  v.tokens[511] = "<|user|>";
  v.types[511] = kTokenUserDefined;
  v.tokens[510] = "<|u";  // shorter, inside the longer one: the longer wins where both match
  v.types[510] = kTokenUserDefined;
  {
    const auto t = Tokenizer::create(v);
    // llama.cpp: "Hi " | <|user|> | " x" with the space prefix ("\u2581\u2581x").
    EXPECT_EQ(t->encode("Hi <|user|> x", true), (std::vector<int32_t>{1, 320, 417, 410, 511, 410, 410, 444}));
    EXPECT_EQ(t->encode("<|user|><|user|>", false), (std::vector<int32_t>{511, 511}));
    std::vector<int32_t> partial = {510};  // "<|u" whole, then "s" with the space prefix
    for (const int32_t id : t->encode("s", false)) partial.push_back(id);
    EXPECT_EQ(t->encode("<|us", false), partial);
    EXPECT_EQ(t->decode(t->encode("a <|user|>b", true)), "a <|user|> b");  // the prefix space shows
    EXPECT_EQ(t->encode("", true), (std::vector<int32_t>{1}));
  }
  v.add_eos = true;
  EXPECT_EQ(Tokenizer::create(v)->encode("Hi", true), (std::vector<int32_t>{1, 320, 417, 2}));
  EXPECT_EQ(Tokenizer::create(v)->encode("Hi", false), (std::vector<int32_t>{320, 417}));
  v.add_bos = false;
  EXPECT_EQ(Tokenizer::create(v)->encode("Hi", true), (std::vector<int32_t>{320, 417, 2}));
}

TEST(TokenizerTest, UnsupportedModelAndBadVocabularies) {
  Vocabulary v = toy_vocab();
  v.model = "t5";
  try {
    Tokenizer::create(v);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tokenizer model 't5' is not supported (supported: llama, gpt2)");
  }
  v = toy_vocab();
  v.scores.pop_back();
  EXPECT_THROW(Tokenizer::create(v), Error);
  v = toy_vocab();
  v.bos = 9;
  EXPECT_THROW(Tokenizer::create(v), Error);
  v = toy_vocab();
  v.tokens.clear();
  v.scores.clear();
  v.types.clear();
  EXPECT_THROW(Tokenizer::create(v), Error);
}

// Minimal GGUF writer for vocabulary error cases.
template <typename T>
std::string enc(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
std::string enc_str(std::string_view s) { return enc<uint64_t>(s.size()) + std::string(s); }

class VocabFileTest : public ::testing::Test {
 protected:

  void kv(const std::string& key, GgufType t, const std::string& payload) {
    kvs_.push_back(enc_str(key) + enc<uint32_t>(static_cast<uint32_t>(t)) + payload);
  }
  void strings(const std::string& key, const std::vector<std::string>& items) {
    std::string p = enc<uint32_t>(static_cast<uint32_t>(GgufType::STRING)) + enc<uint64_t>(items.size());
    for (const auto& s : items) p += enc_str(s);
    kv(key, GgufType::ARRAY, p);
  }
  void floats(const std::string& key, size_t n) {
    std::string p = enc<uint32_t>(static_cast<uint32_t>(GgufType::FLOAT32)) + enc<uint64_t>(n);
    for (size_t i = 0; i < n; ++i) p += enc<float>(-static_cast<float>(i));
    kv(key, GgufType::ARRAY, p);
  }
  // Writes the file and returns the error message of load_vocabulary ("" if none).
  std::string load_error() {
    std::string bytes = "GGUF" + enc<uint32_t>(3) + enc<uint64_t>(0) + enc<uint64_t>(kvs_.size());
    for (const auto& k : kvs_) bytes += k;
    path_ = dir_ + "/vocab.gguf";
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes;
    try {
      load_vocabulary(*GgufFile::open(path_));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  test::TempDir tmp_;
  const std::string dir_ = tmp_.path();
  std::string path_;
  std::vector<std::string> kvs_;
};

TEST_F(VocabFileTest, Good) {
  kv("tokenizer.ggml.model", GgufType::STRING, enc_str("llama"));
  strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "x"});
  floats("tokenizer.ggml.scores", 4);
  kv("tokenizer.ggml.add_bos_token", GgufType::BOOL, enc<uint8_t>(0));
  kv("tokenizer.ggml.padding_token_id", GgufType::INT32, enc<int32_t>(3));
  EXPECT_EQ(load_error(), "");
  const Vocabulary v = load_vocabulary(*GgufFile::open(path_));
  EXPECT_EQ(v.bos, 1);  // llama defaults when the ids are absent
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.pad, 3);
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.scores[3], -3.0f);
  EXPECT_TRUE(v.types.empty());  // absent: the tokenizer infers them
}

TEST_F(VocabFileTest, MissingTokens) {
  kv("tokenizer.ggml.model", GgufType::STRING, enc_str("llama"));
  const std::string err = load_error();
  EXPECT_NE(err.find("tokenizer.ggml.tokens"), std::string::npos) << err;
  EXPECT_NE(err.find(path_), std::string::npos) << err;
}

TEST_F(VocabFileTest, LengthMismatch) {
  kv("tokenizer.ggml.model", GgufType::STRING, enc_str("llama"));
  strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "x"});
  floats("tokenizer.ggml.scores", 3);
  const std::string err = load_error();
  EXPECT_NE(err.find("tokenizer.ggml.scores"), std::string::npos) << err;
  EXPECT_NE(err.find("3 entries"), std::string::npos) << err;
}

TEST_F(VocabFileTest, IdOutOfRange) {
  kv("tokenizer.ggml.model", GgufType::STRING, enc_str("llama"));
  strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "x"});
  kv("tokenizer.ggml.eos_token_id", GgufType::UINT32, enc<uint32_t>(4));
  const std::string err = load_error();
  EXPECT_NE(err.find("tokenizer.ggml.eos_token_id"), std::string::npos) << err;
  EXPECT_NE(err.find("outside the vocabulary"), std::string::npos) << err;
}

TEST_F(VocabFileTest, WrongTypeForTokens) {
  kv("tokenizer.ggml.model", GgufType::STRING, enc_str("llama"));
  floats("tokenizer.ggml.tokens", 4);
  const std::string err = load_error();
  EXPECT_NE(err.find("array of float32"), std::string::npos) << err;
  EXPECT_NE(err.find("array of string"), std::string::npos) << err;
}

}  // namespace
}  // namespace tessera
