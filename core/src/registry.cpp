#include "tessera/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "plugin_library.h"

#ifndef TESSERA_INSTALL_PLUGIN_DIR
#define TESSERA_INSTALL_PLUGIN_DIR ""
#endif

namespace tessera {

namespace fs = std::filesystem;

// Collects one library's registrations; they join the registry only if the whole library succeeds,
// so a refused library leaves nothing behind.
class Registry::Adder final : public Registrar {
 public:
  Adder(const Registry& registry, std::shared_ptr<PluginLibrary> library)
      : registry_(registry), library_(std::move(library)) {}

  void add_erased(ComponentKind kind, std::string name, std::string doc,
                  std::vector<ParamSpec> params, ErasedFactory create) override {
    const std::string& here = library_->path();
    if (const PluginEntry* other = registry_.find(kind, name)) {
      throw Error("duplicate plugin " + std::string(kind_name(kind)) + " '" + name +
                  "': registered by " + other->library + " and again by " + here);
    }
    for (const auto& e : pending) {
      if (e->kind == kind && e->name == name) {
        throw Error("duplicate plugin " + std::string(kind_name(kind)) + " '" + name +
                    "': registered twice by " + here);
      }
    }
    auto entry = std::make_unique<PluginEntry>();
    entry->kind = kind;
    entry->name = std::move(name);
    entry->doc = std::move(doc);
    entry->params = std::move(params);
    entry->library = here;
    entry->create = std::move(create);
    entry->owner = library_;
    pending.push_back(std::move(entry));
  }

  std::vector<std::unique_ptr<PluginEntry>> pending;

 private:
  const Registry& registry_;
  std::shared_ptr<PluginLibrary> library_;
};

Registry::Registry() = default;

// Entries (and the factories they hold, which are plugin code) go before the libraries.
Registry::~Registry() {
  entries_.clear();
  libraries_.clear();
}

void Registry::load_library(const fs::path& path) {
  const std::string canonical = fs::weakly_canonical(path).string();
  for (const auto& lib : libraries_) {
    if (lib->path() == canonical) return;
  }
  auto library = std::make_shared<PluginLibrary>(canonical);
  Adder adder(*this, library);
  char error[1024] = {0};
  if (!library->manifest().register_components(adder, error, sizeof error)) {
    throw Error(canonical + ": plugin registration failed: " + error);
  }
  library->keep_loaded();
  for (auto& e : adder.pending) entries_.push_back(std::move(e));
  libraries_.push_back(std::move(library));
}

void Registry::load_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    const std::string file = item.path().filename().string();
    if (file.starts_with("libtessera_") && item.path().extension() == ".so") {
      files.push_back(item.path());
    }
  }
  std::sort(files.begin(), files.end());  // deterministic order, so duplicate errors are stable
  for (const auto& f : files) {
    try {
      load_library(f);
    } catch (const Error& e) {
      failures_.push_back({f.string(), e.what()});
    }
  }
}

std::vector<fs::path> Registry::default_search_path() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("TESSERA_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':')) {
      if (!item.empty()) dirs.emplace_back(item);
    }
  }
  // The core library sits in <prefix>/lib, plugins in <prefix>/lib/tessera/plugins, in the build
  // tree and in an installation alike; find them from where libtessera_core itself was loaded.
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&Registry::default_search_path), &info) != 0 &&
      info.dli_fname != nullptr) {
    dirs.push_back(fs::path(info.dli_fname).parent_path() / "tessera" / "plugins");
  }
  if (std::string(TESSERA_INSTALL_PLUGIN_DIR).size() > 0) dirs.emplace_back(TESSERA_INSTALL_PLUGIN_DIR);
  // Drop duplicates, keeping the first (highest-priority) occurrence.
  std::vector<fs::path> unique;
  for (const auto& d : dirs) {
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(d, ec);
    if (std::find(unique.begin(), unique.end(), c) == unique.end()) unique.push_back(c);
  }
  return unique;
}

void Registry::load_default_paths() {
  for (const auto& dir : default_search_path()) load_directory(dir);
}

const PluginEntry* Registry::find(ComponentKind kind, std::string_view name) const {
  for (const auto& e : entries_) {
    if (e->kind == kind && e->name == name) return e.get();
  }
  return nullptr;
}

std::vector<const PluginEntry*> Registry::entries(ComponentKind kind) const {
  std::vector<const PluginEntry*> out;
  for (const auto& e : entries_) {
    if (e->kind == kind) out.push_back(e.get());
  }
  return out;
}

std::vector<const PluginEntry*> Registry::all_entries() const {
  std::vector<const PluginEntry*> out;
  for (const auto& e : entries_) out.push_back(e.get());
  return out;
}

const PluginEntry& Registry::require(ComponentKind kind, std::string_view name) const {
  if (const PluginEntry* e = find(kind, name)) return *e;
  std::string msg = "unknown " + std::string(kind_name(kind)) + " plugin '" + std::string(name) + "'";
  std::string available;
  for (const auto* e : entries(kind)) available += (available.empty() ? "" : ", ") + e->name;
  msg += " (available: " + (available.empty() ? std::string("none") : available) + ")";
  if (entries_.empty() && failures_.empty()) {
    msg += "; no plugin libraries were found — set TESSERA_PLUGIN_PATH to the directory that holds "
           "libtessera_*.so";
  }
  for (const auto& f : failures_) msg += "; not loaded: " + f.message;
  throw Error(msg);
}

std::shared_ptr<void> Registry::create_erased(ComponentKind kind, std::string_view name,
                                              const Params& params) const {
  const PluginEntry& entry = require(kind, name);
  std::shared_ptr<void> object;
  try {
    object = entry.create(params);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // another library's exception (a JSON type error...): worded here
    throw Error(std::string(kind_name(kind)) + " " + entry.name + ": " + e.what());
  } catch (...) {
    throw Error(std::string(kind_name(kind)) + " plugin '" + entry.name + "' (" + entry.library +
                ") threw an exception that is not a std::exception");
  }
  if (!object) {
    throw Error(std::string(kind_name(kind)) + " plugin '" + entry.name + "' (" + entry.library +
                ") returned no object");
  }
  // The returned pointer shares ownership of a holder that also holds the library (which is never
  // unmapped: see PluginLibrary).
  struct Holder {
    std::shared_ptr<PluginLibrary> library;
    std::shared_ptr<void> object;
  };
  auto holder = std::make_shared<Holder>(Holder{entry.owner, std::move(object)});
  return std::shared_ptr<void>(holder, holder->object.get());
}

}  // namespace tessera
