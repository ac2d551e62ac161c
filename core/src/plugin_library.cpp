#include "plugin_library.h"

#include <cstddef>
#include <string>

#include "tessera/error.h"

namespace tessera {

PluginLibrary::PluginLibrary(const std::filesystem::path& path) : path_(path.string()) {
  if (!std::filesystem::exists(path)) throw Error(path_ + ": plugin library not found");
  boost::dll::fs::error_code ec;
  library_.load(path, ec, boost::dll::load_mode::rtld_lazy | boost::dll::load_mode::rtld_local);
  if (ec) throw Error(path_ + ": cannot load plugin library: " + ec.message());
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
  if (std::string(manifest_->build_id) != TESSERA_BUILD_ID) {
    throw Error(path_ + ": plugin build identity '" + manifest_->build_id + "' (" +
                manifest_->compiler + ") does not match this Tessera's '" TESSERA_BUILD_ID
                "'; rebuild the plugin with the same toolchain");
  }
}

}  // namespace tessera
