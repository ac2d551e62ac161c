#include "string_format_gbnf.h"

namespace tessera::grammar {

namespace {

// Days per month without leap years: February 29 is valid in some years only, so it is left out.
const char* const kDate =
    "[0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | "
    "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
    "\"02\" \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))";
// RFC 3339 full-time; second 60 (leap seconds) is left out.
const char* const kTime =
    "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]+)? "
    "(\"Z\" | [+\\-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
const char* const kHex = "[0-9a-fA-F]";
// A DNS label: letters, digits and inner hyphens, at most 63 characters.
const char* const kLabel = "[a-zA-Z0-9] ([a-zA-Z0-9\\-]{0,61} [a-zA-Z0-9])?";
const char* const kOctet = "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])";

}  // namespace

std::optional<std::string> string_format_gbnf(std::string_view format) {
  const std::string label = std::string("(") + kLabel + ")";
  const std::string hex = kHex;
  if (format == "date") return std::string("(") + kDate + ")";
  if (format == "time") return std::string("(") + kTime + ")";
  if (format == "date-time") return std::string("(") + kDate + ") \"T\" (" + kTime + ")";
  if (format == "uuid")
    return hex + "{8} \"-\" " + hex + "{4} \"-\" " + hex + "{4} \"-\" " + hex + "{4} \"-\" " + hex + "{12}";
  if (format == "ipv4") return std::string(kOctet) + " (\".\" " + kOctet + "){3}";
  if (format == "ipv6") return hex + "{1,4} (\":\" " + hex + "{1,4}){7}";  // the full 8-group form only
  if (format == "hostname") return label + " (\".\" " + label + "){0,3}";
  if (format == "email")
    // Dot-atom local part, at least two domain labels.
    return "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\-]+ (\".\" [a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\-]+)* \"@\" " + label +
           " (\".\" " + label + ")+";
  if (format == "byte")  // OpenAPI: base64 with padding
    return "([A-Za-z0-9+/]{4})* ([A-Za-z0-9+/]{2} \"==\" | [A-Za-z0-9+/]{3} \"=\")?";
  if (format == "uri")
    // scheme "://" host, then path, query, fragment of unreserved, sub-delims, ':' '@' and %HH.
    return "[a-zA-Z] [a-zA-Z0-9+.\\-]* \"://\" " + label + " (\".\" " + label + ")* " +
           "(\"/\" ([a-zA-Z0-9._~!$&'()*+,;=:@\\-] | \"%\" " + hex + hex + ")*)* " +
           "(\"?\" ([a-zA-Z0-9._~!$&'()*+,;=:@/?\\-] | \"%\" " + hex + hex + ")*)? " +
           "(\"#\" ([a-zA-Z0-9._~!$&'()*+,;=:@/?\\-] | \"%\" " + hex + hex + ")*)?";
  return std::nullopt;
}

}  // namespace tessera::grammar
