#include "token_mask.h"

#include <algorithm>
#include <numeric>

namespace tessera::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& pieces) : vocab_(int64_t(pieces.size())) {
  std::vector<int32_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::erase_if(order, [&](int32_t t) { return pieces[size_t(t)].empty(); });
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pieces[size_t(a)] < pieces[size_t(b)]; });
  byte_.push_back(0);
  depth_.push_back(0);
  skip_.push_back(0);
  first_.push_back(0);
  std::vector<uint32_t> path{0};  // open nodes from the root
  const std::string* prev = nullptr;
  for (int32_t t : order) {
    const std::string& s = pieces[size_t(t)];
    size_t common = 0;
    if (prev != nullptr)
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    while (path.size() > common + 1) {
      skip_[path.back()] = uint32_t(byte_.size());
      path.pop_back();
    }
    for (size_t k = common; k < s.size(); ++k) {
      path.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(s[k]));
      depth_.push_back(uint32_t(k + 1));
      skip_.push_back(0);
      first_.push_back(uint32_t(tokens_.size()));
    }
    tokens_.push_back(t);
    prev = &s;
  }
  while (!path.empty()) {
    skip_[path.back()] = uint32_t(byte_.size());
    path.pop_back();
  }
  first_.push_back(uint32_t(tokens_.size()));
  max_depth_ = *std::max_element(depth_.begin(), depth_.end());
}

namespace {

constexpr int32_t kUnknown = -2;
constexpr int32_t kEmpty = -1;
constexpr uint64_t kUnknownDistance = UINT64_MAX - 1;
// Past this many sets in one walk (a grammar whose every path is a new state) the memo starts
// over, so that its memory stays bounded (16K sets of 1 KiB of edges).
constexpr size_t kMaxMemoSets = 1 << 14;

int32_t intern(WalkScratch& s, const std::vector<int32_t>& set) {
  s.key.assign(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t));
  auto [it, added] = s.ids.try_emplace(s.key, int32_t(s.sets.size()));
  if (added) {
    s.sets.push_back(set);
    s.next.emplace_back();
    s.next.back().fill(kUnknown);
    s.distance.push_back(kUnknownDistance);
  }
  return it->second;
}

}  // namespace

void TokenTrie::allowed(Stacks& stacks, const std::vector<int32_t>& tops, uint32_t* mask, Walk& walk,
                        WalkScratch& s) const {
  s.sets.clear();
  s.ids.clear();
  s.next.clear();
  s.distance.clear();
  s.level.assign(max_depth_ + 1, 0);
  s.level[0] = intern(s, tops);
  walk.max_distance = 0;
  const size_t n = byte_.size();
  for (size_t i = 1; i < n;) {
    const uint32_t d = depth_[i];
    const int32_t from = s.level[d - 1];
    int32_t to = s.next[size_t(from)][byte_[i]];
    if (to == kUnknown) {
      stacks.advance(s.sets[size_t(from)], byte_[i], s.tmp);
      if (s.tmp.empty()) {
        to = kEmpty;
        s.next[size_t(from)][byte_[i]] = to;
      } else {
        if (s.sets.size() >= kMaxMemoSets) {
          // Start over, keeping the sets of the path to here.
          std::vector<std::vector<int32_t>> path;
          for (uint32_t k = 0; k < d; ++k) path.push_back(s.sets[size_t(s.level[k])]);
          s.sets.clear();
          s.ids.clear();
          s.next.clear();
          s.distance.clear();
          for (uint32_t k = 0; k < d; ++k) s.level[k] = intern(s, path[k]);
        }
        to = intern(s, s.tmp);
        s.next[size_t(s.level[d - 1])][byte_[i]] = to;
      }
    }
    if (to == kEmpty) {
      i = skip_[i];
      continue;
    }
    s.level[d] = to;
    if (first_[i] < first_[i + 1]) {
      uint64_t& dist = s.distance[size_t(to)];
      if (dist == kUnknownDistance) dist = stacks.distance(s.sets[size_t(to)]);
      if (dist <= walk.budget && (walk.progress == UINT64_MAX || dist + d <= walk.progress)) {
        walk.max_distance = std::max(walk.max_distance, dist);
        for (uint32_t k = first_[i]; k < first_[i + 1]; ++k) {
          const int32_t t = tokens_[k];
          mask[size_t(t) >> 5] |= 1u << (t & 31);
        }
      }
    }
    ++i;
  }
}

}  // namespace tessera::grammar
