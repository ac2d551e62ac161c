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

// #51: /dev/zero grew memory until std::bad_alloc with no file named.
TEST(ReadFile, RefusesDevicesPipesAndFilesPastTheLimitNamingThem) {
  EXPECT_EQ(refusal_of("/dev/zero"),
            "/dev/zero: is not a regular file (a device, pipe or socket); expected the pipeline file");
  test::TempDir dir;
  const std::string big = dir.write("big.yaml", std::string((4 << 20) + 1, '#'));
  EXPECT_EQ(refusal_of(big), big + ": the pipeline file is larger than 4194304 bytes; refused");
  EXPECT_EQ(read_file(dir.write("ok.yaml", std::string(4 << 20, '#')), "pipeline file").size(), size_t(4) << 20);
  // Text inputs may be pipes (`<(...)`): read up to their own limit, and a device past it is refused.
  const ReadLimits small{1000, false};
  EXPECT_EQ(test::message_of([&] { read_file("/dev/zero", "text file", small); }),
            "/dev/zero: the text file is larger than 1000 bytes; refused");
}

}  // namespace
}  // namespace tessera
