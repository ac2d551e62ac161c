// A whole file read into memory, with errors that name the file and what it was meant to be.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

// Bounds on what read_file accepts, so that a path to /dev/zero, a FIFO or a huge file is refused
// naming it instead of growing memory until std::bad_alloc.
struct ReadLimits {
  uint64_t max_bytes = uint64_t(4) << 20;  // configuration files (pipelines, key files) are small
  bool regular_only = true;                // refuse devices, FIFOs and sockets
};
// Large text inputs (eval text, prompt files): may come from a pipe (`<(...)`), up to 1 GiB.
inline constexpr ReadLimits kTextInputLimits{uint64_t(1) << 30, false};

// The bytes of `path`; throws Error "PATH: WHAT not found", "PATH: is a directory; expected the
// WHAT", "PATH: is not a regular file ...", "PATH: the WHAT is larger than N bytes" or
// "PATH: cannot read the WHAT" (`what`: e.g. "pipeline file", "text file").
std::string read_file(const std::string& path, const std::string& what, const ReadLimits& limits = {});

}  // namespace tessera
