#include "tessera/read_file.h"

#include <filesystem>
#include <fstream>

#include "tessera/error.h"

namespace tessera {

std::string read_file(const std::string& path, const std::string& what, const ReadLimits& limits) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw Error(path + ": " + what + " not found");
  if (std::filesystem::is_directory(status)) throw Error(path + ": is a directory; expected the " + what);
  if (limits.regular_only && !std::filesystem::is_regular_file(status)) {
    throw Error(path + ": is not a regular file (a device, pipe or socket); expected the " + what);
  }
  const std::string too_large =
      path + ": the " + what + " is larger than " + std::to_string(limits.max_bytes) + " bytes; refused";
  if (std::filesystem::is_regular_file(status)) {
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > limits.max_bytes) throw Error(too_large);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the " + what);
  // Read in chunks up to the limit: a device or pipe has no size to check beforehand.
  std::string data;
  char chunk[1 << 16];
  while (in) {
    in.read(chunk, sizeof chunk);
    const auto got = uint64_t(in.gcount());
    if (data.size() + got > limits.max_bytes) throw Error(too_large);
    data.append(chunk, size_t(got));
  }
  if (in.bad()) throw Error(path + ": cannot read the " + what);
  return data;
}

}  // namespace tessera
