// Constraint conformance: every constraint plugin the loader finds keeps the contract the decoders
// rely on (tessera/constraint.h): a token is accepted exactly when the mask allows it, rollback
// restores the state, control tokens are never allowed and end tokens only where the output is
// complete, random walks inside the mask give outputs in the language (JSON objects for
// "json_object", one of the listed strings for "choice"), and near the length limit the mask still
// leads to a complete output. Unknown types and a missing vocabulary are refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/constraint.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

// Every single byte (as byte-fallback and byte-level vocabularies have), some longer pieces that
// straddle JSON syntax, pieces that end inside a UTF-8 character, a control token and an end token.
ConstraintVocab test_vocab() {
  ConstraintVocab v;
  for (int b = 0; b < 256; ++b) v.pieces.push_back(std::string(1, char(b)));
  for (const char* p : {"{\"", "\":", "\",\"", "\"}", "true", "false", "null", "}}", "[{", "\\u00", "ab", " {",
                        "12", ".5e", "\xC3", "\xC3\xA9", "\xA9\"", "\"\"", ",\"a\":", "re", "d"})
    v.pieces.push_back(p);
  v.pieces.push_back("");  // a control token
  v.end_tokens.push_back(int32_t(v.pieces.size()));
  v.pieces.push_back("");  // the end token
  return v;
}

class ConstraintConformance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    constraint_ = create_default<Constraint>(GetParam());
    vocab_ = test_vocab();
    constraint_->set_vocabulary(vocab_);
  }
  int32_t end_token() const { return vocab_.end_tokens[0]; }
  int32_t control_token() const { return end_token() - 1; }
  int64_t vocab() const { return int64_t(vocab_.pieces.size()); }

  std::vector<int32_t> allowed(ConstraintState& s, int64_t left) {
    std::vector<uint32_t> mask(mask_words(vocab()), 0xFFFFFFFFu);
    s.fill_mask(mask, left);
    std::vector<int32_t> out;
    for (int32_t t = 0; t < vocab(); ++t)
      if (mask_has(mask, t)) out.push_back(t);
    return out;
  }

  // A random walk inside the mask; returns the bytes. `budget` tokens at most.
  std::string walk(const CompiledConstraint& c, uint64_t seed, int64_t budget, bool check_every_token) {
    auto s = c.start();
    std::mt19937_64 rng(seed);
    std::string out;
    for (int64_t left = budget; left > 0 && !s->finished(); --left) {
      const std::vector<int32_t> ok = allowed(*s, left);
      EXPECT_FALSE(ok.empty()) << "nothing allowed after '" << out << "'";
      if (ok.empty()) break;
      for (int32_t t : ok) EXPECT_NE(t, control_token()) << "a control token was allowed";
      if (check_every_token) {
        const std::set<int32_t> set(ok.begin(), ok.end());
        for (int32_t t = 0; t < vocab(); ++t) {
          const bool took = s->accept(t);
          EXPECT_EQ(took, set.count(t) == 1) << "token " << t << " after '" << out << "': mask and accept disagree";
          if (took) s->rollback(1);
        }
        EXPECT_EQ(allowed(*s, left), ok) << "rollback did not restore the state after '" << out << "'";
      }
      // Prefer ending only sometimes, so that walks also grow.
      int32_t t = ok[rng() % ok.size()];
      if (t == end_token() && ok.size() > 1 && rng() % 4 != 0) t = ok[(rng() % (ok.size() - 1))];
      EXPECT_TRUE(s->accept(t));
      if (t == end_token()) break;
      out += vocab_.pieces[size_t(t)];
    }
    EXPECT_TRUE(s->finished() || !allowed(*s, 1).empty());
    return out;
  }

  std::shared_ptr<Constraint> constraint_;
  ConstraintVocab vocab_;
};

TEST_P(ConstraintConformance, UnknownTypesAndAMissingVocabularyAreRefusedByName) {
  try {
    constraint_->compile({"no_such_type", "x", "request.guided"});
    FAIL() << "an unknown constraint type was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request.guided"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no_such_type"), std::string::npos) << e.what();
  }
  auto fresh = create_default<Constraint>(GetParam());
  EXPECT_THROW(fresh->compile({"json_object", "", "response_format"}), Error);
}

TEST_P(ConstraintConformance, ChoiceWalksGiveExactlyOneOfTheChoices) {
  const std::vector<std::string> choices = {"red", "green", "re", "blue \xC3\xA9t\xC3\xA9"};
  const auto c = constraint_->compile({"choice", nlohmann::json(choices).dump(), "guided_choice"});
  std::set<std::string> seen;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const std::string out = walk(*c, seed, 64, seed < 4);
    EXPECT_NE(std::find(choices.begin(), choices.end(), out), choices.end()) << "'" << out << "' is no choice";
    seen.insert(out);
  }
  EXPECT_GE(seen.size(), 3u) << "random walks should reach most choices";
}

TEST_P(ConstraintConformance, JsonObjectWalksParseAsObjectsAndAcceptMatchesTheMask) {
  const auto c = constraint_->compile({"json_object", "", "response_format"});
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const std::string out = walk(*c, seed, 400, seed < 2);
    const auto v = nlohmann::json::parse(out, nullptr, false);
    EXPECT_FALSE(v.is_discarded()) << "not JSON: " << out;
    EXPECT_TRUE(v.is_object()) << out;
  }
}

TEST_P(ConstraintConformance, FewTokensLeftStillEndInAParsableOutput) {
  const auto c = constraint_->compile({"json_object", "", "response_format"});
  for (int64_t budget : {2, 3, 8, 20}) {
    for (uint64_t seed = 0; seed < 10; ++seed) {
      const std::string out = walk(*c, seed * 31 + uint64_t(budget), budget, false);
      EXPECT_TRUE(nlohmann::json::accept(out)) << "budget " << budget << ", seed " << seed << ": '" << out << "'";
    }
  }
}

TEST_P(ConstraintConformance, EndTokensOnlyWhereTheOutputIsComplete) {
  const auto c = constraint_->compile({"choice", R"(["ab", "abd"])", "guided_choice"});
  auto s = c->start();
  auto has = [&](int32_t t) {
    const auto ok = allowed(*s, 100);
    return std::find(ok.begin(), ok.end(), t) != ok.end();
  };
  EXPECT_FALSE(has(end_token()));
  ASSERT_TRUE(s->accept(int32_t('a')));
  EXPECT_FALSE(has(end_token()));
  EXPECT_FALSE(s->accept(end_token()));
  ASSERT_TRUE(s->accept(int32_t('b')));
  EXPECT_TRUE(has(end_token()));  // "ab" is complete, "abd" goes on
  EXPECT_TRUE(has(int32_t('d')));
  EXPECT_FALSE(s->finished());
  ASSERT_TRUE(s->accept(int32_t('d')));
  EXPECT_TRUE(s->finished());
  EXPECT_EQ(allowed(*s, 100), std::vector<int32_t>{end_token()});
  s->rollback(2);
  EXPECT_FALSE(s->finished());
  EXPECT_TRUE(has(int32_t('b')));
}

INSTANTIATE_TEST_SUITE_P(Constraints, ConstraintConformance, testing::ValuesIn(plugin_names(ComponentKind::constraint)),
                         param_name);

}  // namespace
}  // namespace tessera
