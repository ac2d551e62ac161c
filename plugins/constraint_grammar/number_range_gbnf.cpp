#include "number_range_gbnf.h"

#include <algorithm>
#include <string_view>
#include <vector>

namespace tessera::grammar {

namespace {

std::string join_alts(const std::vector<std::string>& alts) {
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts.front();
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string digit_class(char a, char b) {
  if (a == b) return std::string("\"") + a + "\"";
  if (a == '0' && b == '9') return "[0-9]";
  return std::string("[") + a + "-" + b + "]";
}

std::string any_digits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return "[0-9]{" + std::to_string(n) + "}";
}

std::string concat(std::string a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// Digit strings of x.size() digits (leading zeros allowed) from x to y inclusive; x <= y.
std::string same_length_range(std::string_view x, std::string_view y) {
  if (x.empty()) return "";
  if (x == y) return "\"" + std::string(x) + "\"";
  size_t p = 0;
  while (x[p] == y[p]) ++p;
  const std::string prefix = p ? "\"" + std::string(x.substr(0, p)) + "\"" : "";
  x = x.substr(p);
  y = y.substr(p);
  const size_t rest = x.size() - 1;
  if (x.find_first_not_of('0', 1) == std::string_view::npos && y.find_first_not_of('9', 1) == std::string_view::npos)
    return concat(prefix, concat(digit_class(x[0], y[0]), any_digits(rest)));
  std::vector<std::string> alts;
  const std::string nines(rest, '9'), zeros(rest, '0');
  char lo_first = x[0], hi_first = y[0];
  if (x.substr(1) != zeros) {
    alts.push_back(concat(digit_class(x[0], x[0]), same_length_range(x.substr(1), nines)));
    ++lo_first;
  }
  if (y.substr(1) != nines) --hi_first;
  if (lo_first <= hi_first) alts.push_back(concat(digit_class(lo_first, hi_first), any_digits(rest)));
  if (y.substr(1) != nines) alts.push_back(concat(digit_class(y[0], y[0]), same_length_range(zeros, y.substr(1))));
  return concat(prefix, join_alts(alts));
}

BigInt pow10(size_t n) {
  BigInt v = 1;
  while (n--) v *= 10;
  return v;
}

// Canonical decimal texts of a..b (0 <= a <= b), or a.. when b is unset.
std::string nonneg_range(BigInt a, std::optional<BigInt> b) {
  const std::string as = to_decimal(a);
  std::vector<std::string> alts;
  const size_t top_len = b ? to_decimal(*b).size() : as.size();
  for (size_t d = as.size(); d <= top_len; ++d) {
    BigInt lo = d == 1 ? 0 : pow10(d - 1);
    BigInt hi = pow10(d) - 1;
    if (lo < a) lo = a;
    if (b && hi > *b) hi = *b;
    if (lo > hi) continue;
    alts.push_back(same_length_range(to_decimal(lo), to_decimal(hi)));
  }
  // Open above: up to 15 digits (integers exact in a double), or one more than the bound has.
  if (!b) alts.push_back("[1-9] [0-9]{" + std::to_string(as.size()) + "," + std::to_string(std::max<size_t>(14, as.size())) + "}");
  return join_alts(alts);
}

}  // namespace

std::string to_decimal(BigInt v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  std::string s;
  while (v != 0) {
    int d = static_cast<int>(v % 10);
    if (d < 0) d = -d;
    s.insert(s.begin(), static_cast<char>('0' + d));
    v /= 10;
  }
  return neg ? "-" + s : s;
}

std::string integer_range_gbnf(std::optional<BigInt> lo, std::optional<BigInt> hi) {
  std::vector<std::string> alts;
  // Negative part: magnitudes max(1, -hi) .. -lo.
  if (!lo || *lo < 0) {
    const BigInt mag_lo = hi && *hi < 0 ? -*hi : 1;
    std::optional<BigInt> mag_hi;
    if (lo) mag_hi = -*lo;
    alts.push_back("\"-\" " + nonneg_range(mag_lo, mag_hi));
  }
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo && *lo > 0 ? *lo : 0, hi));
  return join_alts(alts);
}

namespace {

// Non-negative decimals between integer bounds a and b (b unset: unbounded).
std::string nonneg_decimal(BigInt a, bool a_excl, std::optional<BigInt> b, bool b_excl) {
  const std::string any_frac = "(\".\" [0-9]+)?";
  const std::string nonzero_frac = "\".\" [0-9]* [1-9] [0-9]*";
  const std::string zero_frac = "(\".\" \"0\"+)?";
  if (b && *b < a) return "";
  if (b && *b == a) return a_excl || b_excl ? "" : "\"" + to_decimal(a) + "\" " + zero_frac;
  std::vector<std::string> alts;
  alts.push_back("\"" + to_decimal(a) + "\" " + (a_excl ? nonzero_frac : any_frac));
  if (!b) {
    alts.push_back(nonneg_range(a + 1, std::nullopt) + " " + any_frac);
  } else {
    if (a + 1 <= *b - 1) alts.push_back(nonneg_range(a + 1, *b - 1) + " " + any_frac);
    if (!b_excl) alts.push_back("\"" + to_decimal(*b) + "\" " + zero_frac);
  }
  return join_alts(alts);
}

}  // namespace

std::string decimal_range_gbnf(std::optional<BigInt> lo, bool lo_exclusive, std::optional<BigInt> hi,
                               bool hi_exclusive) {
  if (lo && hi && (*lo > *hi || (*lo == *hi && (lo_exclusive || hi_exclusive)))) return "";
  std::vector<std::string> alts;
  if (!lo || *lo < 0) {
    // x < 0: magnitude m = -x in (max(0, -hi), -lo).
    std::string neg;
    std::optional<BigInt> mag_hi;
    if (lo) mag_hi = -*lo;
    if (hi && *hi < 0) neg = nonneg_decimal(-*hi, hi_exclusive, mag_hi, lo_exclusive);
    else neg = nonneg_decimal(0, true, mag_hi, lo_exclusive);
    if (!neg.empty()) alts.push_back("\"-\" " + neg);
  }
  if (!hi || *hi >= 0) {
    std::string pos;
    if (lo && *lo >= 0) pos = nonneg_decimal(*lo, lo_exclusive, hi, hi_exclusive);
    else pos = nonneg_decimal(0, false, hi, hi_exclusive);
    if (!pos.empty()) alts.push_back(pos);
  }
  return join_alts(alts);
}

}  // namespace tessera::grammar
