// Runs a Grammar over bytes: a set of parse stacks, each a chain of frames (position, parent) in an
// arena, so that stacks share their common bottoms and advancing by a byte copies nothing. Frames
// are hash-consed: one id per distinct (position, parent), so equal stacks have equal ids, sets of
// stacks can be compared and memoized by their ids, and an ambiguous grammar's equal parses merge.
// The top frame of every stack points at a byte set; a stack of no frames (kAccept) has matched a
// whole sentence.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar.h"

namespace tessera::grammar {

inline constexpr int32_t kAccept = -1;

struct Frame {
  uint32_t pos = 0;     // top frame: a kBytes element; below: the kRule element being expanded
  int32_t parent = -1;  // the frame below, or -1
};

class Stacks {
 public:
  explicit Stacks(const Grammar& g) : g_(&g) {}
  const Grammar& grammar() const { return *g_; }

  // The tops at the start of the root rule.
  void start(std::vector<int32_t>& out);
  // The tops after `byte` from each of `tops` (empty when no stack takes it), sorted. `out` is
  // overwritten.
  void advance(const std::vector<int32_t>& tops, uint8_t byte, std::vector<int32_t>& out);
  // Fewest bytes from these tops to a complete sentence (kNever when `tops` is empty).
  uint64_t distance(const std::vector<int32_t>& tops) const;
  static bool accepting(const std::vector<int32_t>& tops);
  // A canonical text of the stacks (each one's positions, bottom to top, sorted): equal keys mean
  // the same language from here on, whatever arena the frames are in.
  void key(const std::vector<int32_t>& tops, std::string& out) const;

  // Frames past a mark are scratch (the mask walk) and can be dropped together.
  size_t mark() const { return frames_.size(); }
  void release(size_t mark);

 private:
  // Appends to `out` the tops reached from (pos, parent) without consuming a byte.
  void expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out);
  int32_t push(uint32_t pos, int32_t parent);
  static uint64_t frame_key(uint32_t pos, int32_t parent) { return uint64_t(pos) << 32 | uint32_t(parent); }

  const Grammar* g_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> index_;  // (pos, parent) -> frame id
  std::vector<std::pair<uint32_t, int32_t>> work_;
};

}  // namespace tessera::grammar
