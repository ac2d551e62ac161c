// Writing GBNF text: quoted literals and character classes over Unicode code points, and the UTF-8
// decoding the converters share. The output is plain ASCII (everything else as \uHHHH / \UHHHHHHHH),
// so it survives any transport and reads the same in every terminal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::grammar {

// Sorted, non-overlapping, non-adjacent closed ranges of code points.
using CodeRanges = std::vector<std::pair<char32_t, char32_t>>;

// Code points of valid UTF-8; throws Error naming `what` and the byte offset on invalid UTF-8.
std::u32string decode_utf8(std::string_view text, std::string_view what);
void append_utf8(std::string& out, char32_t cp);

// `"..."` for a sequence of code points (an empty sequence gives `""`).
std::string gbnf_literal(std::u32string_view text);
std::string gbnf_literal_utf8(std::string_view utf8);

// Normalises (sorts, merges) ranges in place.
void normalize_ranges(CodeRanges& ranges);
// Unicode scalar values (surrogates excluded) not in `ranges` (which must be normalised).
CodeRanges complement_ranges(const CodeRanges& ranges);
// `[...]` or `[^...]` (whichever is shorter) for a non-empty normalised set; `.` for every scalar value.
std::string gbnf_class(const CodeRanges& ranges);

}  // namespace tessera::grammar
