// `tessera tokenize` as a user runs it: ids and pieces in JSON and text, the special-token flags,
// clear errors.
#include <gtest/gtest.h>

#include <string>

#include "tessera/gguf_writer.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::Output;
using test::tessera_cmd;

const std::string kGpt2 = test::kShared + "/vocab/ggml-vocab-gpt-2.gguf";
const std::string kSpm = test::kShared + "/vocab/ggml-vocab-llama-spm.gguf";

nlohmann::json json_of(const Output& o) { return nlohmann::json::parse(o.text); }

TEST(CliTokenize, JsonIdsAndPieces) {
  const Output o = tessera_cmd("tokenize --format json -m '" + kGpt2 + "' 'Hello world<|endoftext|>'");
  ASSERT_EQ(o.status, 0) << o.text;
  const auto j = json_of(o);
  // Not parsed: "<|endoftext|>" is text (no BOS either: the file does not ask for it).
  EXPECT_EQ(j["ids"], nlohmann::json({15496, 995, 27, 91, 437, 1659, 5239, 91, 29})) << o.text;
  EXPECT_EQ(j["pieces"], nlohmann::json({"Hello", " world", "<", "|", "end", "of", "text", "|", ">"})) << o.text;
}

TEST(CliTokenize, ParseSpecialAndAddSpecial) {
  const Output parsed = tessera_cmd("tokenize --format json --parse-special -m '" + kGpt2 + "' 'Hello<|endoftext|>'");
  ASSERT_EQ(parsed.status, 0) << parsed.text;
  EXPECT_EQ(json_of(parsed)["ids"], nlohmann::json({15496, 50256}));
  EXPECT_EQ(json_of(parsed)["pieces"], nlohmann::json({"Hello", ""}));  // control tokens have no text

  const Output bos = tessera_cmd("tokenize --format json --add-special -m '" + kSpm + "' 'Hello'");
  ASSERT_EQ(bos.status, 0) << bos.text;
  EXPECT_EQ(json_of(bos)["ids"], nlohmann::json({1, 15043}));
  const Output none = tessera_cmd("tokenize --format json -m '" + kSpm + "' 'Hello'");
  EXPECT_EQ(json_of(none)["ids"], nlohmann::json({15043}));
  EXPECT_EQ(json_of(none)["pieces"], nlohmann::json({" Hello"}));
}

TEST(CliTokenize, PartialCharactersAreEscapedSafely) {
  // One emoji is three GPT-2 tokens, none a whole character: JSON shows U+FFFD, text shows bytes.
  const std::string emoji = "\xF0\x9F\xA6\x99";
  const Output j = tessera_cmd("tokenize --format json -m '" + kGpt2 + "' '" + emoji + "'");
  ASSERT_EQ(j.status, 0) << j.text;
  const auto parsed = json_of(j);
  ASSERT_EQ(parsed["ids"].size(), 3u) << j.text;
  const Output t = tessera_cmd("tokenize -m '" + kGpt2 + "' '" + emoji + " a\nb'");
  ASSERT_EQ(t.status, 0) << t.text;
  EXPECT_EQ(t.text, "8582\t\\xF0\\x9F\n99\t\\xA6\n247\t\\x99\n257\t a\n198\t\\n\n65\tb\n");
}

TEST(CliTokenize, ClearErrors) {
  const Output missing = tessera_cmd("tokenize -m /nonexistent/vocab.gguf hi");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.text.find("/nonexistent/vocab.gguf"), std::string::npos) << missing.text;

  // A GGUF file without a tokenizer.
  test::TempDir dir;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  const std::string path = dir.path() + "/no_tokenizer.gguf";
  w.write(path);
  const Output none = tessera_cmd("tokenize -m '" + path + "' hi");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.text.find("has no tokenizer"), std::string::npos) << none.text;

  const Output no_text = tessera_cmd("tokenize -m '" + kGpt2 + "'");
  EXPECT_NE(no_text.status, 0);
  const Output bad_format = tessera_cmd("tokenize --format yaml -m '" + kGpt2 + "' hi");
  EXPECT_NE(bad_format.status, 0);
}

}  // namespace
}  // namespace tessera
