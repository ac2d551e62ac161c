// JSON Schema -> GBNF (the dialect plugins/constraint_grammar parses). The grammar accepts compact JSON
// (no whitespace between tokens) and only texts valid under the schema; where exactness is out of a
// context-free grammar's reach it generates a valid subset, and what it cannot honour at all is refused:
// tessera::Error "json_schema: unsupported keyword 'K' at /json/pointer" (or names the bad value).
//
// Choices a caller should know:
// - Properties come in the schema's order (parse the schema as nlohmann::ordered_json to keep it;
//   nlohmann::json sorts keys); optional ones may be absent, required ones may not.
// - additionalProperties absent: an object schema that lists `properties` gets no extra members (a
//   valid subset, as llama.cpp and XGrammar's strict mode do; extra keys only give a model room to
//   ramble); one that lists none allows any members. `true` or a schema: extra members after the listed
//   ones, with keys that are none of the listed names.
// - oneOf is generated as anyOf: "exactly one branch" is not expressible in a grammar; schemas whose
//   branches overlap can yield a text two branches accept.
// - Bounded numbers have no exponent; February has 28 days in `date`; `format`s are sound subsets.
// - JSON Schema keywords this converter cannot honour (not, if/then/else, dependencies, propertyNames,
//   uniqueItems: true, multipleOf other than 1, ...) are refused. Annotations (title, description,
//   default, examples, $comment, readOnly, ... and x-* vendor extensions) are ignored, and so are
//   keywords in no JSON Schema vocabulary: every validator ignores them, so no output can break the
//   schema through them (real schemas are full of them: 47 of the 112 in shared/schemas, e.g.
//   `_format`, `alias`, `readonly`). JsonSchemaOptions::refuse_unknown_keywords refuses them instead
//   ("unknown keyword 'K' at /ptr"), for callers who would rather hear about a misspelt "maxLenght".
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tessera::grammar {

struct JsonSchemaOptions {
  bool refuse_unknown_keywords = false;
};

// GBNF text (start rule `root`) accepting exactly the compact JSON texts generated for `schema`.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
// Same; object members come in sorted key order (nlohmann::json keeps no other).
std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options = {});
// Parses `schema_text` keeping member order; a JSON syntax error is reported as an Error too.
std::string json_schema_text_to_gbnf(std::string_view schema_text, const JsonSchemaOptions& options = {});

// Any compact JSON object (OpenAI response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace tessera::grammar
