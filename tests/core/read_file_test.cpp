// read_file: the whole file, or an error naming the file and what it was meant to be.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tessera/error.h"
#include "tessera/read_file.h"

namespace tessera {
namespace {

std::string refusal_of(const std::string& path) {
  return test::message_of([&] { read_file(path, "pipeline file"); });
}

TEST(ReadFile, ReturnsEveryByteAndNamesWhatIsWrongOtherwise) {
  test::TempDir dir;
  const std::string bytes("a\0b\r\nlast", 9);
  EXPECT_EQ(read_file(dir.write("f.yaml", bytes), "pipeline file"), bytes);
  EXPECT_EQ(read_file(dir.write("empty.yaml", ""), "pipeline file"), "");
  EXPECT_EQ(refusal_of(dir.path() + "/none.yaml"), dir.path() + "/none.yaml: pipeline file not found");
  EXPECT_EQ(refusal_of(dir.path()), dir.path() + ": is a directory; expected the pipeline file");
}

}  // namespace
}  // namespace tessera
