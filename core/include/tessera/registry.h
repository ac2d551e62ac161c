// The registry: loads plugin libraries (Boost.DLL) and creates components by (kind, name).
// Objects it creates keep their library loaded for as long as they live.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/registrar.h"

namespace tessera {

class PluginLibrary;  // a loaded shared library (core/src)

struct PluginEntry {
  ComponentKind kind;
  std::string name;
  std::string doc;
  std::vector<ParamSpec> params;
  std::string library;  // path of the file that registered it
  ErasedFactory create;
  std::shared_ptr<PluginLibrary> owner;
};

struct LoadFailure {
  std::string library;
  std::string message;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Loads one library; throws tessera::Error naming the file on any refusal (not a plugin, ABI or
  // build mismatch, failed registration, duplicate names). Loading the same file twice is a no-op.
  void load_library(const std::filesystem::path& path);
  // Loads every libtessera_*.so in `dir`; refusals are kept in failures() rather than thrown, so one
  // broken library does not hide the others.
  void load_directory(const std::filesystem::path& dir);
  // The default search path: TESSERA_PLUGIN_PATH (colon-separated), the directory beside the running
  // executable (<exe>/../lib/tessera/plugins), and the install prefix.
  void load_default_paths();
  static std::vector<std::filesystem::path> default_search_path();

  const PluginEntry* find(ComponentKind kind, std::string_view name) const;
  std::vector<const PluginEntry*> entries(ComponentKind kind) const;
  std::vector<const PluginEntry*> all_entries() const;
  const std::vector<LoadFailure>& failures() const { return failures_; }

  // Creates `name` of kind T from already validated params; throws Error for an unknown name,
  // listing those available (and libraries that failed to load).
  template <class T>
  std::shared_ptr<T> create(std::string_view name, const Params& params) const {
    return std::static_pointer_cast<T>(create_erased(KindOf<T>::value, name, params));
  }
  // Validates `raw` parameters against the plugin's declaration first (`where` names the source).
  template <class T>
  std::shared_ptr<T> create(std::string_view name, const nlohmann::json& raw,
                            const std::string& where) const {
    return create<T>(name, validate_params(require(KindOf<T>::value, name).params, raw, where));
  }

  const PluginEntry& require(ComponentKind kind, std::string_view name) const;

 private:
  std::shared_ptr<void> create_erased(ComponentKind kind, std::string_view name,
                                      const Params& params) const;
  class Adder;
  std::vector<std::unique_ptr<PluginEntry>> entries_;
  std::vector<std::shared_ptr<PluginLibrary>> libraries_;
  std::vector<LoadFailure> failures_;
};

}  // namespace tessera
