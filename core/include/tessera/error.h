// Error type used across the core and plugins. Messages name the problem: file, line, field, value.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

// Its vtable and type info live in libtessera_core (out-of-line destructor, default visibility), so
// an Error thrown by a plugin stays valid after that plugin's library is unloaded.
class __attribute__((visibility("default"))) Error : public std::runtime_error {
 public:
  // Control bytes in the message (a NUL inside a GGUF string or a YAML value) are written as \xNN:
  // what() is a C string, and a NUL would cut the message there.
  explicit Error(const std::string& message) : std::runtime_error(printable(message)) {}
  ~Error() override;

  static std::string printable(const std::string& message);
};

}  // namespace tessera
