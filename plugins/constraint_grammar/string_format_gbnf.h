// GBNF for the string `format`s a JSON Schema may name: date-time, date, time (RFC 3339), uuid, email,
// hostname, ipv4, ipv6, uri, and OpenAPI's byte (base64). Each grammar is a sound subset: every text it accepts
// passes the format (e.g. February stops at 28, addresses have no leading zeros), and it is all ASCII
// with nothing JSON needs escaped, so it can stand between a string's quotes as is.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tessera::grammar {

// The expression for the string's content, or nullopt for a format this converter does not know.
std::optional<std::string> string_format_gbnf(std::string_view format);

}  // namespace tessera::grammar
