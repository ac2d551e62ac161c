#include "tessera/read_file.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tessera/error.h"

namespace tessera {

std::string read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw Error(path + ": " + what + " not found");
  if (std::filesystem::is_directory(status)) throw Error(path + ": is a directory; expected the " + what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the " + what);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(path + ": cannot read the " + what);
  return data;
}

}  // namespace tessera
