// JSON Pointers (RFC 6901) in their URI-fragment form, as a schema's "$ref": "#/definitions/a%20b".
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace tessera::grammar {

// The value `pointer` ("" or "/a/0/b~1c", percent-escapes decoded) names inside `root`, or nullptr
// when a step does not exist (an absent key, an index past the end or not a number).
const nlohmann::ordered_json* find_json_pointer(const nlohmann::ordered_json& root, std::string_view pointer);

}  // namespace tessera::grammar
