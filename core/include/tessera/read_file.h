// A whole file read into memory, with errors that name the file and what it was meant to be.
#pragma once

#include <string>

namespace tessera {

// The bytes of `path`; throws Error "PATH: WHAT not found", "PATH: is a directory; expected the
// WHAT" or "PATH: cannot read the WHAT" (`what`: e.g. "pipeline file", "text file").
std::string read_file(const std::string& path, const std::string& what);

}  // namespace tessera
