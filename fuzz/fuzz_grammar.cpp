// The grammar compiler and matcher, through the real `grammar` constraint plugin: byte 0 picks the
// type (GBNF, regular expression, JSON Schema, choice list), the rest is its text. Compiling either
// succeeds or throws tessera::Error; a compiled constraint is then walked for a few tokens over a
// small vocabulary, where every token the mask allows must be accepted. Another exception, a crash,
// a hang, a leak or undefined behaviour is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tessera/constraint.h"
#include "tessera/error.h"
#include "tessera/registry.h"

namespace {

std::shared_ptr<tessera::Constraint> constraint() {
  static const auto c = [] {
    static tessera::Registry registry;
    const char* dir = std::getenv("TESSERA_FUZZ_PLUGIN_DIR");
    registry.load_directory(dir != nullptr ? dir : TESSERA_PLUGIN_DIR);
    auto made = registry.create<tessera::Constraint>("grammar", nlohmann::json::object(), "fuzz");
    tessera::ConstraintVocab v;
    for (int b = 0; b < 256; ++b) v.pieces.push_back(std::string(1, char(b)));
    for (const char* p : {"{\"", "\":", "\",\"", "true", "null", "12", "\xC3\xA9", "\xE2\x82"}) v.pieces.push_back(p);
    v.end_tokens.push_back(int32_t(v.pieces.size()));
    v.pieces.push_back("");
    made->set_vocabulary(v);
    return made;
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* const kTypes[] = {"grammar", "regex", "json_schema", "choice"};
  const tessera::ConstraintSpec spec{kTypes[data[0] % 4], std::string(reinterpret_cast<const char*>(data + 1), size - 1),
                                     "fuzz"};
  std::shared_ptr<const tessera::CompiledConstraint> c;
  try {
    c = constraint()->compile(spec);
  } catch (const tessera::Error&) {
    return 0;
  }
  try {
    auto s = c->start();
    const int64_t vocab = 256 + 9;
    std::vector<uint32_t> mask(tessera::mask_words(vocab));
    uint32_t pick = data[0];
    for (int step = 0; step < 24 && !s->finished(); ++step) {
      s->fill_mask(mask, 24 - step);
      std::vector<int32_t> ok;
      for (int32_t t = 0; t < vocab; ++t)
        if (tessera::mask_has(mask, t)) ok.push_back(t);
      if (ok.empty()) break;
      pick = pick * 1103515245u + 12345u;
      if (!s->accept(ok[pick % ok.size()])) std::abort();  // the mask allowed a token accept refuses
    }
  } catch (const tessera::Error&) {
    // A grammar too ambiguous to follow is refused while walking, by message.
  }
  return 0;
}
