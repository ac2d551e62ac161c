// GGUF reader: any bytes either open as a GGUF file or throw tessera::Error (another exception, a
// crash, a leak or undefined behaviour is a finding). What opens is read as the engine reads it:
// every metadata getter, the model configuration and the tokenizer's vocabulary.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/model.h"
#include "tessera/tokenizer.h"

namespace {

void read_everything(const tessera::GgufFile& f) {
  for (const auto& [key, value] : f.metadata()) {
    (void)value.type_str();
    // Each getter either returns or throws Error naming the key and the types.
    try { (void)f.get_string(key); } catch (const tessera::Error&) {}
    try { (void)f.get_int(key); } catch (const tessera::Error&) {}
    try { (void)f.get_float(key); } catch (const tessera::Error&) {}
    try { (void)f.get_bool(key, false); } catch (const tessera::Error&) {}
    try { (void)f.get_string_array(key); } catch (const tessera::Error&) {}
    try { (void)f.get_float_array(key); } catch (const tessera::Error&) {}
    try { (void)f.get_int_array(key); } catch (const tessera::Error&) {}
  }
  for (const tessera::GgufTensor& t : f.tensors()) {
    (void)t.elements();
    if (f.find_tensor(t.name) == nullptr) __builtin_trap();  // every listed tensor is found by name
  }
  try { (void)tessera::read_model_config(f); } catch (const tessera::Error&) {}
  try {
    auto tok = tessera::Tokenizer::create(tessera::load_vocabulary(f));
    const auto ids = tok->encode("Hello world <s> \xe2\x96\x81x", true, true);
    (void)tok->decode(ids);
  } catch (const tessera::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const tessera::fuzz::MemFile file(data, size);
  std::shared_ptr<const tessera::GgufFile> f;
  try {
    f = tessera::GgufFile::open(file.path());
  } catch (const tessera::Error&) {
    return 0;
  }
  read_everything(*f);
  return 0;
}
