// Tokenizers of real vocabularies (../shared/vocab: vocabulary-only GGUF files of six model
// families) against llama.cpp's test vectors, every case; round trips; special-token parsing;
// BOS/EOS; refusal of an unknown pre-tokenizer.
#include "tessera/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/error.h"
#include "tessera/gguf.h"

namespace tessera {
namespace {

const std::string kVocabDir = std::string(TESSERA_SHARED_DIR) + "/vocab/";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::unique_ptr<Tokenizer> load(const std::string& name) {
  return Tokenizer::create(load_vocabulary(*GgufFile::open(kVocabDir + name)));
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// The .inp cases are separated by "\n__ggml_vocab_test__\n" (the last one ends with it); line i of
// .out holds case i's ids.
std::vector<Case> read_cases(const std::string& name) {
  const std::string inp = read_all(kVocabDir + name + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  for (size_t at = 0; at < inp.size();) {
    const size_t end = inp.find(sep, at);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(at, end - at), {}});
    at = end + sep.size();
  }
  std::istringstream out(read_all(kVocabDir + name + ".out"));
  std::string line;
  for (Case& c : cases) {
    if (!std::getline(out, line)) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

struct VocabFile {
  std::string name;
  size_t cases;  // how many the .inp holds: a parse error cannot pass silently
};

class VocabVectors : public ::testing::TestWithParam<VocabFile> {};

TEST_P(VocabVectors, EveryCaseMatchesLlamaCpp) {
  const auto tok = load(GetParam().name);
  const std::vector<Case> cases = read_cases(GetParam().name);
  ASSERT_EQ(cases.size(), GetParam().cases);
  size_t passed = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> got = tok->encode(c.text, false);
    EXPECT_EQ(got, c.ids) << "text: " << testing::PrintToString(c.text);
    passed += got == c.ids;
  }
  EXPECT_EQ(passed, cases.size());
  RecordProperty("vectors_passed", static_cast<int>(passed));
}

TEST_P(VocabVectors, RoundTrips) {
  const auto tok = load(GetParam().name);
  const bool spm = tok->vocabulary().model == "llama";
  for (const Case& c : read_cases(GetParam().name)) {
    // SentencePiece puts a space in front that decode removes after BOS; byte-level BPE adds none.
    EXPECT_EQ(tok->decode(tok->encode(c.text, true)), c.text) << testing::PrintToString(c.text);
    if (!spm) EXPECT_EQ(tok->decode(tok->encode(c.text, false)), c.text) << testing::PrintToString(c.text);
  }
}

// A byte whose byte-level character the vocabulary lacks (StarCoder has none for 0xF1) becomes the
// vocabulary's <unk>, as in Hugging Face tokenizers; the rest of the text keeps its tokens.
TEST(VocabBytes, AByteWithoutATokenIsUnknown) {
  const auto sc = load("ggml-vocab-starcoder.gguf");
  const int32_t unk = sc->vocabulary().unk;
  ASSERT_GE(unk, 0);
  const std::vector<int32_t> ids = sc->encode(" this \xF1\x8D\x9F\xA6", false, false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), unk), 1) << "one byte without a token";
  EXPECT_EQ(sc->decode({ids.begin(), ids.begin() + 1}), " this");
}

TEST_P(VocabVectors, EncodeIsThreadSafe) {
  const auto tok = load(GetParam().name);
  const std::vector<Case> cases = read_cases(GetParam().name);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (const Case& c : cases) mismatches[t] += tok->encode(c.text, false) != c.ids;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

INSTANTIATE_TEST_SUITE_P(SharedVocab, VocabVectors,
                         ::testing::Values(VocabFile{"ggml-vocab-llama-spm.gguf", 46}, VocabFile{"ggml-vocab-phi-3.gguf", 46},
                                           VocabFile{"ggml-vocab-gpt-2.gguf", 46}, VocabFile{"ggml-vocab-falcon.gguf", 46},
                                           VocabFile{"ggml-vocab-deepseek-llm.gguf", 46},
                                           VocabFile{"ggml-vocab-starcoder.gguf", 46}),
                         [](const auto& info) {
                           std::string n = info.param.name.substr(11, info.param.name.size() - 16);  // the family
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// --- Special tokens, BOS/EOS, refusals ---------------------------------------------------------

TEST(VocabSpecialTokens, ParseSpecialInBpe) {
  const auto gpt2 = load("ggml-vocab-gpt-2.gguf");
  const std::string text = "Hello<|endoftext|> world";
  // Parsed: the control token's text becomes the token, the text around it is tokenized apart.
  EXPECT_EQ(gpt2->encode(text, false, true), (std::vector<int32_t>{15496, 50256, 995}));
  // Not parsed: plain text (the default, and what two-argument callers get).
  const std::vector<int32_t> plain = gpt2->encode(text, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(gpt2->encode(text, false, false), plain);
  EXPECT_EQ(gpt2->decode(plain), text);
  // Control tokens decode to nothing; their text is the vocabulary's.
  EXPECT_EQ(gpt2->token_to_piece(50256), "");
  EXPECT_EQ(gpt2->decode(gpt2->encode(text, false, true)), "Hello world");

  // StarCoder: the longest special text wins where one contains another's start.
  const auto sc = load("ggml-vocab-starcoder.gguf");
  const std::vector<int32_t> ids = sc->encode("<fim_prefix>def f():<fim_suffix><fim_middle>", false, true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 2, ids.end()), (std::vector<int32_t>{3, 2}));
  const std::vector<int32_t> body = sc->encode("def f():", false);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end() - 2), body);
}

TEST(VocabSpecialTokens, ParseSpecialInSentencePiece) {
  const auto spm = load("ggml-vocab-llama-spm.gguf");
  const std::vector<int32_t> hello = spm->encode("Hello", false);  // "\u2581Hello"
  // Parsed: <s> is BOS, and the text after it takes the space prefix (as llama.cpp and Hugging Face).
  std::vector<int32_t> want = {1};
  want.insert(want.end(), hello.begin(), hello.end());
  EXPECT_EQ(spm->encode("<s>Hello", false, true), want);
  want.push_back(2);
  EXPECT_EQ(spm->encode("<s>Hello</s>", false, true), want);
  // Not parsed: "<s>" is text.
  const std::vector<int32_t> plain = spm->encode("<s>Hello", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(spm->decode(plain), " <s>Hello");  // no BOS: the prefix space stays
  EXPECT_EQ(spm->encode("<s>Hello", false, false), plain);
  // Phi-3's user-defined "</s>" is a token even unparsed; its control "<|user|>" only when parsed.
  const auto phi3 = load("ggml-vocab-phi-3.gguf");
  const std::vector<int32_t> unparsed = phi3->encode("<|user|>Hi</s>", false);
  EXPECT_EQ(unparsed.back(), 2);
  EXPECT_EQ(std::count(unparsed.begin(), unparsed.end(), 32010), 0);
  const std::vector<int32_t> parsed = phi3->encode("<|user|>Hi</s>", false, true);
  EXPECT_EQ(parsed.front(), 32010);
  EXPECT_EQ(parsed.back(), 2);
}

TEST(VocabSpecialTokens, UserDefinedTokensAlwaysMatch) {
  // DeepSeek LLM's added single characters (user-defined "ö" = 100003) win over BPE, as in llama.cpp.
  const auto ds = load("ggml-vocab-deepseek-llm.gguf");
  const std::vector<int32_t> ids = ds->encode("K\xC3\xB6ln", false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 100003), ids.end());
  EXPECT_EQ(ds->token_to_piece(100003), "\xC3\xB6");
  EXPECT_EQ(ds->decode(ids), "K\xC3\xB6ln");
}

TEST(VocabSpecialTokens, AddSpecialFollowsTheVocabulary) {
  // GPT-2: no tokenizer.ggml.add_bos_token, and llama.cpp adds none for pre "gpt-2".
  const auto gpt2 = load("ggml-vocab-gpt-2.gguf");
  EXPECT_FALSE(gpt2->vocabulary().add_bos);
  EXPECT_EQ(gpt2->vocabulary().pre, "gpt-2");
  EXPECT_EQ(gpt2->encode("Hello", true), (std::vector<int32_t>{15496}));
  // DeepSeek LLM says add_bos_token = true.
  const auto ds = load("ggml-vocab-deepseek-llm.gguf");
  EXPECT_EQ(ds->encode("Hello", true).front(), 100000);
  EXPECT_EQ(ds->encode("Hello", true).size(), ds->encode("Hello", false).size() + 1);
  // SentencePiece: BOS by default.
  const auto spm = load("ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(spm->encode("Hello", true).front(), 1);
  // EOS where the vocabulary asks for it.
  Vocabulary v = load_vocabulary(*GgufFile::open(kVocabDir + "ggml-vocab-gpt-2.gguf"));
  v.add_eos = true;
  v.add_bos = true;
  EXPECT_EQ(Tokenizer::create(v)->encode("Hello", true), (std::vector<int32_t>{50256, 15496, 50256}));
  EXPECT_EQ(Tokenizer::create(v)->encode("Hello", false), (std::vector<int32_t>{15496}));
}

TEST(VocabSpecialTokens, UnknownPreTokenizerIsRefused) {
  Vocabulary v = load_vocabulary(*GgufFile::open(kVocabDir + "ggml-vocab-gpt-2.gguf"));
  v.pre = "my-new-model";
  try {
    Tokenizer::create(v);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'my-new-model'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
    for (const char* name : {"gpt-2", "llama-bpe", "qwen2", "falcon", "deepseek-llm", "deepseek-coder", "starcoder",
                             "mpt", "gpt-neox", "smollm", "command-r"}) {
      EXPECT_NE(msg.find(name), std::string::npos) << name << " missing from: " << msg;
    }
  }
}

}  // namespace
}  // namespace tessera
