#include "plugin_library.h"

#include <dlfcn.h>
#include <elf.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/error.h"

namespace tessera {

namespace {

// dlopen maps a library's segments as its headers describe them; a file cut short (an interrupted
// build or copy) then faults with SIGBUS on first touch instead of failing the load. So the headers
// and every loaded segment must lie inside the file before dlopen sees it.
void check_elf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read plugin library");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr eh{};
  if (size < sizeof eh || !in.read(reinterpret_cast<char*>(&eh), sizeof eh) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_type != ET_DYN) {
    throw Error(path + ": not a 64-bit ELF shared library (" + std::to_string(size) + " bytes)");
  }
  auto truncated = [&](uint64_t needed) {
    return Error(path + ": truncated plugin library: its headers need " + std::to_string(needed) +
                 " bytes but the file has " + std::to_string(size) + " (an interrupted build or copy?)");
  };
  const uint64_t ph_end = eh.e_phoff + uint64_t(eh.e_phnum) * eh.e_phentsize;
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || ph_end > size) throw truncated(ph_end);
  if (eh.e_shoff != 0 && eh.e_shoff + uint64_t(eh.e_shnum) * eh.e_shentsize > size) {
    throw truncated(eh.e_shoff + uint64_t(eh.e_shnum) * eh.e_shentsize);
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  in.seekg(std::streamoff(eh.e_phoff));
  if (!in.read(reinterpret_cast<char*>(ph.data()), std::streamsize(ph.size() * sizeof(Elf64_Phdr)))) {
    throw truncated(ph_end);
  }
  for (const Elf64_Phdr& p : ph) {
    if (p.p_type == PT_LOAD && p.p_offset + p.p_filesz > size) throw truncated(p.p_offset + p.p_filesz);
  }
}

}  // namespace

PluginLibrary::PluginLibrary(const std::filesystem::path& path) : path_(path.string()) {
  if (!std::filesystem::exists(path)) throw Error(path_ + ": plugin library not found");
  if (!std::filesystem::is_regular_file(path)) throw Error(path_ + ": not a plugin library (not a regular file)");
  check_elf_file(path_);
  boost::dll::fs::error_code ec;
  // Every symbol resolved now: a plugin calling a core function this core lacks (built against a
  // newer SDK) is refused here, naming the symbol, instead of killing the process at its first call.
  library_.load(path, ec, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec) {
    // Boost's error code says "Bad file descriptor" for a missing dependency or symbol; the dynamic
    // loader says which: ask it again, to word the refusal.
    std::string why = ec.message();
    if (void* h = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL); h != nullptr) {
      dlclose(h);
    } else if (const char* e = dlerror(); e != nullptr) {
      why = e;
    }
    throw Error(path_ + ": cannot load plugin library: " + why);
  }
  if (!library_.has(TESSERA_PLUGIN_ENTRY_SYMBOL)) {
    throw Error(path_ + ": not a Tessera plugin (no exported '" TESSERA_PLUGIN_ENTRY_SYMBOL
                "' entry point)");
  }
  using EntryFn = const PluginManifest*() noexcept;
  auto& entry = library_.get<EntryFn>(TESSERA_PLUGIN_ENTRY_SYMBOL);
  manifest_ = entry();
  if (manifest_ == nullptr) throw Error(path_ + ": plugin entry point returned no manifest");
  // abi_version is the first field in every version of the manifest, so it is safe to read first.
  if (manifest_->abi_version != TESSERA_ABI_VERSION) {
    throw Error(path_ + ": plugin ABI version " + std::to_string(manifest_->abi_version) +
                ", but this Tessera expects " + std::to_string(TESSERA_ABI_VERSION) +
                "; rebuild the plugin against this SDK");
  }
  // The manifest is append-only: a plugin built before a field was added has a shorter one, which
  // is fine as long as it holds the fields of the first layout (later ones are read only when
  // manifest_size covers them).
  constexpr size_t kFirstLayoutSize =
      offsetof(PluginManifest, register_components) + sizeof(PluginManifest::register_components);
  if (manifest_->manifest_size < kFirstLayoutSize) {
    throw Error(path_ + ": plugin manifest is truncated (" +
                std::to_string(manifest_->manifest_size) + " bytes)");
  }
  if (manifest_->build_id == nullptr || manifest_->library_name == nullptr || manifest_->compiler == nullptr ||
      manifest_->register_components == nullptr) {
    throw Error(path_ + ": plugin manifest has a null field (build_id, library_name, compiler or "
                "register_components); build the plugin with the TESSERA_PLUGIN macro");
  }
  if (std::string(manifest_->build_id) != TESSERA_BUILD_ID) {
    throw Error(path_ + ": plugin build identity '" + manifest_->build_id + "' (" +
                manifest_->compiler + ") does not match this Tessera's '" TESSERA_BUILD_ID
                "'; rebuild the plugin with the same toolchain");
  }
}

void PluginLibrary::keep_loaded() const {
  // Never unloaded once accepted: an exception a plugin threw (its type's vtable and what() live in
  // the library) may still be unwinding, or be caught and read, after the objects that held the
  // library are gone. A refused library is not pinned and unloads with its PluginLibrary.
  void* pin = dlopen(path_.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  if (pin == nullptr) throw Error(path_ + ": cannot keep the plugin library loaded: " + std::string(dlerror()));
  dlclose(pin);
}

}  // namespace tessera
