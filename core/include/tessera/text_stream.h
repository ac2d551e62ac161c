// Incremental detokenization with stop strings for one sequence (the engine keeps one per request):
// token pieces (Tokenizer::token_to_piece) arrive one by one; the text is matched against stop
// strings across token boundaries, and released for streaming only once it is complete UTF-8 and
// can no longer turn out to be the start of a stop string.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class TextStream {
 public:
  TextStream() = default;
  // Empty stop strings are the caller's to refuse.
  explicit TextStream(std::vector<std::string> stops);

  // Appends one token's bytes. Returns true when the text now contains a stop string; the text is
  // then cut before the earliest match and nothing more may be appended.
  bool append(std::string_view piece);
  // The text released since the last call: complete UTF-8 that no stop string can claim.
  std::string_view take_ready();
  // At the end of generation: everything not yet released (possibly an incomplete UTF-8 tail).
  std::string_view take_rest();
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::string text_;
  size_t released_ = 0;
  bool stopped_ = false;
};

}  // namespace tessera
