// Writes the GGUF seeds of fuzz_gguf: small synthetic models (every architecture synth writes, a few
// weight types, RoPE scalings) as `tessera synth` writes them, tens of KB each so that mutations stay
// fast. Usage: make_fuzz_seeds <folder>
#include <cstdio>
#include <string>

#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/synth.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds <folder>\n");
    return 2;
  }
  const std::string dir = argv[1];
  int written = 0;
  auto write = [&](tessera::SynthSpec s, const std::string& name) {
    s.dim = 32;
    s.ffn_dim = 48;
    s.n_layers = 1;
    s.n_heads = 2;
    s.n_kv_heads = 1;
    s.vocab = 260;  // the least synth writes (256 byte tokens and the specials)
    s.context_length = 64;
    s.seed = 1;
    try {
      tessera::write_synthetic_model(s, dir + "/" + name + ".gguf");
      ++written;
    } catch (const tessera::Error& e) {
      std::fprintf(stderr, "make_fuzz_seeds: %s: %s\n", name.c_str(), e.what());
    }
  };
  for (const std::string& arch : tessera::synth_architectures()) {
    tessera::SynthSpec s = tessera::synth_preset("tiny");
    s.arch = arch;
    write(s, "synth-" + arch);
  }
  using tessera::DType;
  for (DType dtype : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q5_1}) {
    tessera::SynthSpec s = tessera::synth_preset("tiny");
    s.dtype = dtype;
    write(s, "synth-llama-" + std::string(tessera::dtype_name(dtype)));
  }
  for (const char* scaling : {"linear", "yarn", "freqs"}) {
    tessera::SynthSpec s = tessera::synth_preset("tiny");
    s.rope_scaling = scaling;
    write(s, std::string("synth-llama-rope-") + scaling);
  }
  std::printf("make_fuzz_seeds: %d GGUF files in %s\n", written, dir.c_str());
  return written > 0 ? 0 : 1;
}
