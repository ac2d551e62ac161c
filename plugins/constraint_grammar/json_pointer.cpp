#include "json_pointer.h"

#include <algorithm>
#include <string>

namespace tessera::grammar {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One reference token: "~1" is '/', "~0" is '~', "%HH" a byte; anything else stands for itself.
std::string unescape(std::string_view raw) {
  std::string token;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '~' && i + 1 < raw.size() && (raw[i + 1] == '0' || raw[i + 1] == '1')) {
      token += raw[++i] == '1' ? '/' : '~';
    } else if (raw[i] == '%' && i + 2 < raw.size() && hex_digit(raw[i + 1]) >= 0 && hex_digit(raw[i + 2]) >= 0) {
      token += static_cast<char>(hex_digit(raw[i + 1]) * 16 + hex_digit(raw[i + 2]));
      i += 2;
    } else {
      token += raw[i];
    }
  }
  return token;
}

}  // namespace

const nlohmann::ordered_json* find_json_pointer(const nlohmann::ordered_json& root, std::string_view pointer) {
  const nlohmann::ordered_json* node = &root;
  size_t pos = 0;
  while (pos < pointer.size()) {
    if (pointer[pos] != '/') return nullptr;
    const size_t next = std::min(pointer.find('/', pos + 1), pointer.size());
    const std::string token = unescape(pointer.substr(pos + 1, next - pos - 1));
    if (node->is_object()) {
      const auto it = node->find(token);
      if (it == node->end()) return nullptr;
      node = &*it;
    } else if (node->is_array()) {
      // An index: digits without a leading zero, below the size (9 digits at most: no overflow).
      if (token.empty() || token.size() > 9 || token.find_first_not_of("0123456789") != std::string::npos ||
          (token.size() > 1 && token[0] == '0'))
        return nullptr;
      const size_t index = std::stoul(token);
      if (index >= node->size()) return nullptr;
      node = &(*node)[index];
    } else {
      return nullptr;
    }
    pos = next;
  }
  return node;
}

}  // namespace tessera::grammar
