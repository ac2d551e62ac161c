// Jinja2's lexer (jinja2/lexer.py) as HF transformers configures it: trim_blocks, lstrip_blocks,
// keep_trailing_newline off, newlines normalised to \n.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "jinja_ast.h"
#include "tessera/error.h"

namespace tessera::jinja {

namespace {

class Lexer {
 public:
  Lexer(std::string source, const std::string& name) : src_(std::move(source)), name_(name) {
    for (size_t k = 0; k < src_.size(); ++k) {
      if (src_[k] == '\n') newlines_.push_back(k);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t j = pos;
      while (true) {
        j = src_.find('{', j);
        if (j == std::string::npos || j + 1 >= src_.size()) break;
        const char c = src_[j + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++j;
      }
      if (j == std::string::npos || j + 1 >= src_.size()) {
        emit(Tok::data, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[j + 1];
      const char sign = j + 2 < src_.size() && (src_[j + 2] == '-' || src_[j + 2] == '+') ? src_[j + 2] : 0;
      std::string text = src_.substr(pos, j - pos);
      text = strip_before(std::move(text), sign, kind != '{', line_starting);
      emit(Tok::data, text, pos);
      size_t p = j + 2 + (sign != 0 ? 1 : 0);
      if (kind == '#') {
        pos = comment(p, j);
      } else if (kind == '%' && raw_begin(p, &p)) {
        pos = raw(p, j);
      } else {
        pos = tag(kind == '%', p, j);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{Tok::eof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  int line_at(size_t pos) const {
    return 1 + int(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin());
  }

  [[noreturn]] void error(const std::string& what, size_t pos) const {
    throw Error("template '" + name_ + "' line " + std::to_string(line_at(pos)) + ": " + what);
  }

  void emit(Tok type, std::string text, size_t pos) {
    if (type == Tok::data && text.empty()) return;
    tokens_.push_back(Token{type, std::move(text), line_at(pos)});
  }

  static bool space_at(const std::string& s, size_t pos, size_t* len) {
    const auto c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      *len = 1;
      return is_py_space(c);
    }
    const size_t n = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 4;
    if (pos + n > s.size()) return false;
    const std::vector<uint32_t> cp = decode_utf8(std::string_view(s).substr(pos, n));
    *len = n;
    return cp.size() == 1 && is_py_space(cp[0]);
  }

  size_t skip_space(size_t pos) const {
    size_t len = 0;
    while (pos < src_.size() && space_at(src_, pos, &len)) pos += len;
    return pos;
  }

  // The text before a tag: `-` strips all trailing whitespace; lstrip_blocks strips the spaces
  // between the line's start and a block or comment tag when nothing else precedes it on the line.
  static std::string strip_before(std::string text, char sign, bool block_or_comment, bool line_starting) {
    if (sign == '-') return py_strip(text, nullptr, false, true);
    if (sign == '+' || !block_or_comment) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos >= text.size()) return text;
    size_t k = l_pos, len = 0;
    while (k < text.size() && space_at(text, k, &len)) k += len;
    if (k == text.size()) text.resize(l_pos);
    return text;
  }

  size_t comment(size_t p, size_t start) {
    const size_t q = src_.find("#}", p);
    if (q == std::string::npos) error("missing end of comment tag", start);
    const char before = q > p ? src_[q - 1] : 0;
    if (before == '-') return skip_space(q + 2);
    if (before == '+') return q + 2;
    return q + 2 < src_.size() && src_[q + 2] == '\n' ? q + 3 : q + 2;
  }

  bool raw_begin(size_t p, size_t* end) const {
    p = skip_space(p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_space(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      *end = skip_space(p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *end = p + 2;
      return true;
    }
    return false;
  }

  size_t raw(size_t p, size_t start) {
    size_t q = p;
    while ((q = src_.find("{%", q)) != std::string::npos) {
      size_t r = q + 2;
      const char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : 0;
      if (sign != 0) ++r;
      r = skip_space(r);
      if (src_.compare(r, 6, "endraw") == 0) {
        r = skip_space(r + 6);
        size_t end = 0;
        if (src_.compare(r, 3, "+%}") == 0) {
          end = r + 3;
        } else if (src_.compare(r, 3, "-%}") == 0) {
          end = skip_space(r + 3);
        } else if (src_.compare(r, 2, "%}") == 0) {
          end = r + 2 < src_.size() && src_[r + 2] == '\n' ? r + 3 : r + 2;
        }
        if (end != 0) {
          emit(Tok::data, strip_before(src_.substr(p, q - p), sign, true, false), p);
          return end;
        }
      }
      q += 2;
    }
    error("missing end of raw directive", start);
  }

  // The tokens of a {% %} or {{ }} tag; returns the position after it.
  size_t tag(bool block, size_t p, size_t start) {
    emit(block ? Tok::block_begin : Tok::var_begin, block ? "{%" : "{{", start);
    std::vector<char> balance;
    while (true) {
      if (p >= src_.size()) error(block ? "unexpected end of template inside a {% %} tag" : "unexpected end of template inside a {{ }} tag", start);
      if (balance.empty()) {
        const char* close = block ? "%}" : "}}";
        if (block && src_.compare(p, 3, "+%}") == 0) {
          emit(Tok::block_end, "", p);
          return p + 3;
        }
        if (src_[p] == '-' && src_.compare(p + 1, 2, close) == 0) {
          emit(block ? Tok::block_end : Tok::var_end, "", p);
          return skip_space(p + 3);
        }
        if (src_.compare(p, 2, close) == 0) {
          emit(block ? Tok::block_end : Tok::var_end, "", p);
          if (block && p + 2 < src_.size() && src_[p + 2] == '\n') return p + 3;
          return p + 2;
        }
      }
      size_t len = 0;
      if (space_at(src_, p, &len)) {
        p = skip_space(p);
        continue;
      }
      const char c = src_[p];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        p = number(p);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        emit(Tok::name, src_.substr(p, e - p), p);
        p = e;
      } else if (c == '\'' || c == '"') {
        p = string(p);
      } else {
        p = op(p, balance);
      }
    }
  }

  size_t number(size_t p) {
    size_t e = p;
    auto digits = [&](size_t k) {
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
      return k;
    };
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (src_[p] == '0' && p + 1 < src_.size() && std::strchr("xXoObB", src_[p + 1]) != nullptr) {
      const int base = std::tolower(src_[p + 1]) == 'x' ? 16 : std::tolower(src_[p + 1]) == 'o' ? 8 : 2;
      e = p + 2;
      while (e < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      std::string d;
      for (size_t k = p + 2; k < e; ++k) {
        if (src_[k] != '_') d += src_[k];
      }
      emit(Tok::integer, std::to_string(std::stoll(d, nullptr, base)), p);
      return e;
    }
    e = digits(p);
    bool is_float = false;
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        e = digits(k);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    emit(is_float ? Tok::floating : Tok::integer, text, p);
    return e;
  }

  size_t string(size_t p) {
    const char quote = src_[p];
    std::string out;
    size_t k = p + 1;
    auto hex = [&](size_t n) -> uint32_t {
      if (k + n > src_.size()) error("truncated escape in a string literal", p);
      uint32_t v = 0;
      for (size_t j = 0; j < n; ++j) {
        const char h = src_[k + j];
        if (!std::isxdigit(static_cast<unsigned char>(h))) error("truncated \\xXX escape in a string literal", p);
        v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
      }
      k += n;
      return v;
    };
    while (true) {
      if (k >= src_.size()) error("unexpected end of template inside a string literal", p);
      const char c = src_[k];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) error("unexpected end of template inside a string literal", p);
      const char e = src_[k + 1];
      k += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': append_utf8(out, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int n = 0; n < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++n) v = v * 8 + uint32_t(src_[k++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    emit(Tok::string, out, p);
    return k + 1;
  }

  size_t op(size_t p, std::vector<char>& balance) {
    static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* t : two) {
      if (src_.compare(p, 2, t) == 0) {
        emit(Tok::op, t, p);
        return p + 2;
      }
    }
    const char c = src_[p];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr) {
      error(std::string("unexpected character '") + c + "' in a tag", p);
    }
    if (c == '(' || c == '[' || c == '{') balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error(std::string("unexpected '") + c + "'", p);
      if (balance.back() != c) error(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", p);
      balance.pop_back();
    }
    emit(Tok::op, std::string(1, c), p);
    return p + 1;
  }

  std::string src_;
  std::string name_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

// Newlines as \n; one trailing newline dropped (keep_trailing_newline=False).
std::string normalize(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& name) {
  return Lexer(normalize(source), name).run();
}

}  // namespace tessera::jinja
