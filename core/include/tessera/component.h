// What every component kind has in common.
#pragma once

#include <string_view>
#include <vector>

#include "tessera/backend.h"

namespace tessera {

enum class ComponentKind : uint8_t { backend, quantizer, attention, cache, scheduler, decoder, constraint, comm };
inline constexpr ComponentKind kComponentKinds[] = {
    ComponentKind::quantizer, ComponentKind::attention, ComponentKind::cache,
    ComponentKind::scheduler, ComponentKind::decoder, ComponentKind::constraint, ComponentKind::comm};

std::string_view kind_name(ComponentKind k);
// Inverse of kind_name; returns false when the text names no kind.
bool parse_kind(std::string_view text, ComponentKind* out);

}  // namespace tessera
