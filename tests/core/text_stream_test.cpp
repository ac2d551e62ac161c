// Streaming detokenization: stop strings matched across token boundaries, text held back while it
// may still become a stop string, and only complete UTF-8 released.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/text_stream.h"

namespace tessera {
namespace {

// Feeds pieces and collects what take_ready() releases after each, then take_rest().
struct Fed {
  std::vector<std::string> released;
  std::string joined;
  bool stopped = false;
};

Fed feed(TextStream& s, const std::vector<std::string>& pieces) {
  Fed f;
  for (const auto& p : pieces) {
    if (s.append(p)) {
      f.stopped = true;
      break;
    }
    f.released.emplace_back(s.take_ready());
  }
  f.released.emplace_back(s.take_rest());
  for (const auto& r : f.released) f.joined += r;
  return f;
}

TEST(TextStream, StopStringAcrossTokensCutsBeforeTheMatch) {
  TextStream s({"re wa"});
  const Fed f = feed(s, {",", " there", " was", " a"});
  EXPECT_TRUE(f.stopped);
  EXPECT_EQ(s.text(), ", the");
  EXPECT_EQ(f.joined, ", the");
  // " there" ends with "re", the start of the stop string: held back until " was" decides.
  EXPECT_EQ(f.released[1], " the");
}

TEST(TextStream, HeldBackTextIsReleasedWhenItTurnsOutNotToBeAStop) {
  TextStream s({"STOP"});
  const Fed f = feed(s, {"a ST", "OP", "!"});
  EXPECT_TRUE(f.stopped);
  EXPECT_EQ(s.text(), "a ");
  TextStream t({"STOP"});
  const Fed g = feed(t, {"a ST", "OR", "Y"});
  EXPECT_FALSE(g.stopped);
  EXPECT_EQ(g.released[0], "a ");
  EXPECT_EQ(g.released[1], "STOR");
  EXPECT_EQ(g.joined, "a STORY");
  EXPECT_EQ(t.text(), "a STORY");
}

TEST(TextStream, EarliestOfSeveralStopStringsWins) {
  TextStream s({"cd", "bcdx", "b"});
  feed(s, {"a", "bcd"});
  EXPECT_EQ(s.text(), "a");
}

TEST(TextStream, ReleasesOnlyCompleteUtf8) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, split across byte tokens.
  TextStream s;
  const Fed f = feed(s, {"x\xC3", "\xA9", "\xE2\x82", "\xAC", "\xF0", "\x9F\x98", "\x80", "y"});
  ASSERT_EQ(f.released.size(), 9u);
  EXPECT_EQ(f.released[0], "x");
  EXPECT_EQ(f.released[1], "\xC3\xA9");
  EXPECT_EQ(f.released[2], "");
  EXPECT_EQ(f.released[3], "\xE2\x82\xAC");
  EXPECT_EQ(f.released[4], "");
  EXPECT_EQ(f.released[5], "");
  EXPECT_EQ(f.released[6], "\xF0\x9F\x98\x80");
  EXPECT_EQ(f.released[7], "y");
  EXPECT_EQ(f.joined, s.text());
}

TEST(TextStream, AnIncompleteTailComesOutAtTheEnd) {
  TextStream s;
  const Fed f = feed(s, {"ab\xE2\x82"});
  EXPECT_EQ(f.released[0], "ab");
  EXPECT_EQ(f.released[1], "\xE2\x82");
  EXPECT_EQ(f.joined, s.text());
}

}  // namespace
}  // namespace tessera
