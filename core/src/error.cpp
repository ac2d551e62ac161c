#include "tessera/error.h"

namespace tessera {

Error::~Error() = default;

std::string Error::printable(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 || c == '\n' || c == '\t') {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

}  // namespace tessera
