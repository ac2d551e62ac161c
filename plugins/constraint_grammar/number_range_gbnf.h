// Exact GBNF for JSON numbers inside bounds: integers in [lo, hi] (either side open), and decimals
// between integer bounds, inclusive or exclusive. Written as alternatives over digit strings (no
// leading zeros, no "-0", no exponent), so every accepted text parses to an in-range value.
#pragma once

#include <optional>
#include <string>

namespace tessera::grammar {

using BigInt = __int128;

// Integers n with lo <= n <= hi (nullopt: unbounded on that side). Requires lo <= hi when both set.
std::string integer_range_gbnf(std::optional<BigInt> lo, std::optional<BigInt> hi);

// Decimals x (optional fraction, no exponent) with lo <(=) x <(=) hi; bounds are integers.
// Returns "" when the range is empty.
std::string decimal_range_gbnf(std::optional<BigInt> lo, bool lo_exclusive, std::optional<BigInt> hi,
                               bool hi_exclusive);

std::string to_decimal(BigInt v);

}  // namespace tessera::grammar
