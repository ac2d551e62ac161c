#include "tessera/constraint.h"
#include "tessera/tokenizer.h"

namespace tessera {

ConstraintVocab constraint_vocab(const Tokenizer& tokenizer) {
  ConstraintVocab v;
  const Vocabulary& vocab = tokenizer.vocabulary();
  v.pieces.reserve(vocab.tokens.size());
  for (int32_t t = 0; t < tokenizer.vocab_size(); ++t) {
    const int32_t type = vocab.types[size_t(t)];
    // Control, unused and unknown tokens spell nothing a grammar could match.
    const bool spells = type != kTokenControl && type != kTokenUnused && type != kTokenUnknown;
    v.pieces.push_back(spells ? tokenizer.token_to_piece(t) : std::string());
  }
  if (tokenizer.eos() >= 0) v.end_tokens.push_back(tokenizer.eos());
  return v;
}

}  // namespace tessera
