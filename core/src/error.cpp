#include "tessera/error.h"

namespace tessera {

Error::~Error() = default;

}  // namespace tessera
