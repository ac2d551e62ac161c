#include "tessera/text_stream.h"

#include <algorithm>

namespace tessera {
namespace {

// Length of the UTF-8 sequence a lead byte starts (1 for ASCII and for stray bytes).
size_t utf8_len(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
}

bool TextStream::append(std::string_view piece) {
  if (stopped_) return true;
  const size_t old = text_.size();
  text_.append(piece);
  if (stops_.empty()) return false;
  // A new match must end in the new bytes, so it starts at most longest_stop_ - 1 bytes before them.
  const size_t from = old >= longest_stop_ ? old - longest_stop_ + 1 : 0;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = text_.find(s, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut == std::string::npos) return false;
  text_.resize(std::max(cut, released_));
  stopped_ = true;
  return true;
}

std::string_view TextStream::take_ready() {
  size_t end = text_.size();
  if (!stopped_) {
    // Hold back the longest tail that is the beginning of some stop string.
    for (const auto& s : stops_) {
      if (s.empty()) continue;
      for (size_t k = std::min(s.size() - 1, text_.size()); k > 0; --k) {
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          end = std::min(end, text_.size() - k);
          break;
        }
      }
    }
    // Hold back a UTF-8 sequence whose last bytes have not arrived.
    for (size_t i = end; i > released_ && end - i < 4; --i) {
      const auto c = static_cast<unsigned char>(text_[i - 1]);
      if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back for the lead
      if (i - 1 + utf8_len(c) > end) end = i - 1;
      break;
    }
  }
  end = std::max(end, released_);
  std::string_view out(text_.data() + released_, end - released_);
  released_ = end;
  return out;
}

std::string_view TextStream::take_rest() {
  std::string_view out(text_.data() + released_, text_.size() - released_);
  released_ = text_.size();
  return out;
}

}  // namespace tessera
