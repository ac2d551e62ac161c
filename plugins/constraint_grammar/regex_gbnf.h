// Regular expression -> GBNF: the ECMA-262 subset that JSON Schema `pattern` and vLLM's guided_regex
// use. Literals, escapes (\d \w \s \D \W \S, \n \t \r \f \v \0, \xHH, \uHHHH, \u{H...}, \cX, escaped
// punctuation), classes [...] with ranges and negation, `.`, groups (...) (?:...) (?<name>...),
// alternation, quantifiers * + ? {n} {n,} {n,m} (lazy forms read as greedy: a grammar has no
// preference), and anchors ^ $ at the start/end of a top-level alternative. Everything else
// (backreferences, lookaround, word boundaries, \p{...}, inline flags, anchors mid-pattern) throws
// tessera::Error naming the construct and its code point position.
#pragma once

#include <string>
#include <string_view>

namespace tessera::grammar {

// GBNF text whose root rule is `root_name`. whole_match: the whole text must match (guided_regex);
// otherwise a side without its anchor accepts any text there (JSON Schema `pattern` semantics).
std::string regex_to_gbnf(std::string_view pattern, std::string_view root_name, bool whole_match);

// One GBNF expression (no rule definitions) for the *escaped content of a JSON string* whose decoded
// value matches `pattern` with JSON Schema semantics (unanchored sides take any characters).
// `json_char_rule` names a rule accepting one escaped JSON string character (used on open sides).
// Characters that JSON requires escaped are emitted as \" \\ \b \f \n \r \t or \u00XX.
std::string regex_to_json_string_gbnf(std::string_view pattern, std::string_view json_char_rule);

}  // namespace tessera::grammar
