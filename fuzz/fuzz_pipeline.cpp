// Pipeline YAML loader: any bytes either load as a pipeline (then checked against the real plugins'
// declarations, as `tessera run` does) or throw tessera::Error naming the file; another exception,
// a crash, a leak or undefined behaviour is a finding. The input is written beside copies of the
// repository's pipelines/, so that `extends: baseline.yaml` and the like are followed.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/error.h"
#include "tessera/pipeline_spec.h"
#include "tessera/registry.h"

namespace fs = std::filesystem;

namespace {

// The plugins of this build; TESSERA_FUZZ_PLUGIN_DIR overrides the folder.
const tessera::Registry& registry() {
  static const tessera::Registry* r = [] {
    auto* reg = new tessera::Registry();
    const char* dir = std::getenv("TESSERA_FUZZ_PLUGIN_DIR");
    reg->load_directory(dir != nullptr ? dir : TESSERA_PLUGIN_DIR);
    return reg;
  }();
  return *r;
}

fs::path& work_dir() {
  static fs::path dir;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)registry();
  std::string templ = (fs::temp_directory_path() / "tessera-fuzz-pipeline-XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr) std::abort();
  work_dir() = templ;
  for (const auto& e : fs::directory_iterator(fs::path(TESSERA_SOURCE_DIR) / "pipelines")) {
    fs::copy_file(e.path(), work_dir() / e.path().filename());
  }
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(work_dir(), ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path path = work_dir() / "input.yaml";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const tessera::PipelineSpec spec = tessera::load_pipeline_spec(path.string());
    tessera::validate_pipeline_spec(spec, registry());
  } catch (const tessera::Error&) {
  }
  return 0;
}
