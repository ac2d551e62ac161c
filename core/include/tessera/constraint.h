// Constraint: which tokens a decoder may choose next (structured output). A request's constraint (a
// JSON Schema, a grammar, a regular expression...) is compiled once by the pipeline's constraint
// component against the model's vocabulary; each sequence then walks it with its own state. Every
// decoder applies the state's token mask before it picks, and advances the state by the tokens it
// returns, so sampling, greedy and speculative decoding all keep the output inside the language.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera {

// What a request asks for. `type` is one of the component's types (the `grammar` plugin knows
// "json_object", "json_schema", "grammar" (GBNF text), "regex", "choice" (a JSON array of strings));
// `text` its source; `where` names that source in error messages ("response_format.json_schema.schema").
struct ConstraintSpec {
  std::string type;
  std::string text;
  std::string where;
};

// The model's vocabulary as a constraint sees it: each token's raw bytes (Tokenizer::token_to_piece;
// empty for control tokens, which a constraint never allows) and the tokens that end a sequence.
struct ConstraintVocab {
  std::vector<std::string> pieces;
  std::vector<int32_t> end_tokens;
};
class Tokenizer;
// A tokenizer's vocabulary as constraints see it (control, unused and unknown tokens empty; EOS ends).
ConstraintVocab constraint_vocab(const Tokenizer& tokenizer);

// One sequence's position in a compiled constraint. Not thread-safe; one per sequence.
class ConstraintState {
 public:
  virtual ~ConstraintState() = default;
  // Sets bit t (mask[t / 32] >> (t % 32)) for every token allowed next, clears the others.
  // `tokens_left` counts this token: with few left, only tokens from which the output can still be
  // completed within the budget are allowed, so a length-limited output still parses.
  virtual void fill_mask(std::span<uint32_t> mask, int64_t tokens_left) = 0;
  // Advances by `token`; false (state unchanged) when the constraint does not allow it.
  virtual bool accept(int32_t token) = 0;
  // Undoes the last `n` accepted tokens (speculative drafts that were not kept).
  virtual void rollback(int64_t n) = 0;
  // True once an end token was accepted, or when nothing but an end token may follow.
  virtual bool finished() const = 0;
};

class CompiledConstraint {
 public:
  virtual ~CompiledConstraint() = default;
  virtual std::unique_ptr<ConstraintState> start() const = 0;
  // The fewest bytes a complete output has (0 when unknown): an output cut by max_tokens or the
  // context before this many bytes could not have been complete.
  virtual int64_t min_output_bytes() const { return 0; }
};

// The component kind. Created from the pipeline's `constraint:` entry; the pipeline hands it the
// vocabulary once after loading the model.
class Constraint {
 public:
  virtual ~Constraint() = default;
  virtual void set_vocabulary(ConstraintVocab vocab) = 0;
  // Throws tessera::Error naming spec.where and the problem (an unsupported keyword, a syntax
  // error's line and column, an unknown type).
  virtual std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec) const = 0;
};

// Words of a token mask over `vocab` tokens.
inline size_t mask_words(int64_t vocab) { return static_cast<size_t>((vocab + 31) / 32); }
inline bool mask_has(std::span<const uint32_t> mask, int32_t token) {
  return (mask[static_cast<size_t>(token) >> 5] >> (token & 31)) & 1u;
}

}  // namespace tessera
