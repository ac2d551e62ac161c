// OpenAI request parser (the bodies of /v1/completions, /v1/chat/completions, /tokenize and
// /detokenize): any bytes either parse or throw ApiError (a 400 naming the field); another
// exception (a 500), a crash, a leak or undefined behaviour is a finding. The first byte picks the
// endpoint, the rest is the body.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api_error.h"
#include "openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace tessera::serve;
  try {
    switch (data[0] % 4) {
      case 0: (void)parse_openai_request(Endpoint::completions, body); break;
      case 1: (void)parse_openai_request(Endpoint::chat, body); break;
      case 2: (void)parse_tokenize_request(body); break;
      default: (void)parse_detokenize_request(body); break;
    }
  } catch (const ApiError& e) {
    // A client's mistake is a 4xx, and its body serializes as the server writes it (dump_json:
    // bytes that are not UTF-8, which a parse error may quote, are replaced).
    if (e.status() < 400 || e.status() >= 500) __builtin_trap();
    (void)e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
