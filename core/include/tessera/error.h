// Error type used across the core and plugins. Messages name the problem: file, line, field, value.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

// Its vtable and type info live in libtessera_core (out-of-line destructor, default visibility), so
// an Error thrown by a plugin stays valid after that plugin's library is unloaded.
class __attribute__((visibility("default"))) Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  ~Error() override;
};

}  // namespace tessera
