#include "tessera/tensor_pattern.h"

namespace tessera {

namespace {

bool glob(std::string_view p, std::string_view s) {
  // Iterative matcher with one backtrack point for the last '*': linear in practice.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace

bool tensor_matches(std::string_view pattern, std::string_view name) {
  if (glob(pattern, name)) return true;
  constexpr std::string_view kSuffix = ".weight";
  if (name.size() > kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix) {
    return glob(pattern, name.substr(0, name.size() - kSuffix.size()));
  }
  return false;
}

bool tensor_matches_any(const std::vector<std::string>& patterns, std::string_view name) {
  for (const auto& p : patterns) {
    if (tensor_matches(p, name)) return true;
  }
  return false;
}

}  // namespace tessera
