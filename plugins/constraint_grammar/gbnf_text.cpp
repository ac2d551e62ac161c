#include "gbnf_text.h"

#include <algorithm>
#include <cstdio>

#include "tessera/error.h"

namespace tessera::grammar {

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// One code point inside a literal or a class, escaped where GBNF or readability needs it.
void append_escaped(std::string& out, char32_t cp, bool in_class) {
  switch (cp) {
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\\': out += "\\\\"; return;
    default: break;
  }
  if (!in_class && cp == '"') { out += "\\\""; return; }
  if (in_class && (cp == ']' || cp == '[' || cp == '-' || cp == '^')) {
    out += '\\';
    out += static_cast<char>(cp);
    return;
  }
  char buf[16];
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(cp));
  } else if (cp < 0x7F) {
    out += static_cast<char>(cp);
    return;
  } else if (cp <= 0xFFFF) {
    std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(cp));
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(cp));
  }
  out += buf;
}

std::string class_body(const CodeRanges& ranges) {
  std::string out;
  for (const auto& [lo, hi] : ranges) {
    append_escaped(out, lo, true);
    if (hi == lo) continue;
    if (hi != lo + 1) out += '-';
    append_escaped(out, hi, true);
  }
  return out;
}

}  // namespace

std::u32string decode_utf8(std::string_view text, std::string_view what) {
  std::u32string out;
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    int extra = 0;
    char32_t cp = 0;
    if (b0 < 0x80) { cp = b0; }
    else if ((b0 & 0xE0) == 0xC0) { cp = b0 & 0x1F; extra = 1; }
    else if ((b0 & 0xF0) == 0xE0) { cp = b0 & 0x0F; extra = 2; }
    else if ((b0 & 0xF8) == 0xF0) { cp = b0 & 0x07; extra = 3; }
    else throw Error(std::string(what) + ": invalid UTF-8 at byte " + std::to_string(i));
    for (int k = 1; k <= extra; ++k) {
      if (i + k >= text.size()) throw Error(std::string(what) + ": truncated UTF-8 at byte " + std::to_string(i));
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) throw Error(std::string(what) + ": invalid UTF-8 at byte " + std::to_string(i));
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
      throw Error(std::string(what) + ": invalid UTF-8 at byte " + std::to_string(i));
    out += cp;
    i += extra + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string gbnf_literal(std::u32string_view text) {
  std::string out = "\"";
  for (char32_t cp : text) append_escaped(out, cp, false);
  out += '"';
  return out;
}

std::string gbnf_literal_utf8(std::string_view utf8) { return gbnf_literal(decode_utf8(utf8, "literal")); }

void normalize_ranges(CodeRanges& ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodeRanges merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  ranges = std::move(merged);
}

CodeRanges complement_ranges(const CodeRanges& ranges) {
  // Surrogates are not scalar values: they never appear in UTF-8 text, so they are left out of both sides.
  CodeRanges universe = {{0, 0xD7FF}, {0xE000, kMaxCodePoint}};
  CodeRanges out;
  for (auto [ulo, uhi] : universe) {
    char32_t next = ulo;
    for (const auto& [lo, hi] : ranges) {
      if (hi < next || lo > uhi) continue;
      if (lo > next) out.emplace_back(next, lo - 1);
      if (hi >= uhi) { next = uhi + 1; break; }
      next = hi + 1;
    }
    if (next <= uhi) out.emplace_back(next, uhi);
  }
  return out;
}

std::string gbnf_class(const CodeRanges& ranges) {
  const CodeRanges rest = complement_ranges(ranges);
  if (rest.empty()) return ".";
  // The negated form means "any code point but these" to the matcher, surrogates aside.
  const std::string positive = class_body(ranges);
  const std::string negative = class_body(rest);
  if (negative.size() < positive.size()) return "[^" + negative + "]";
  return "[" + positive + "]";
}

}  // namespace tessera::grammar
