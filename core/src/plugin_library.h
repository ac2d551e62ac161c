// A loaded plugin library. Internal to core: plugins never see it.
#pragma once

#include <filesystem>
#include <string>

#define BOOST_DLL_USE_STD_FS
#include <boost/dll/shared_library.hpp>

#include "tessera/plugin.h"

namespace tessera {

class PluginLibrary {
 public:
  // Loads `path` and checks its manifest; throws Error naming the file on any refusal.
  explicit PluginLibrary(const std::filesystem::path& path);
  const std::string& path() const { return path_; }
  const PluginManifest& manifest() const { return *manifest_; }
  // Pins the library for the rest of the process (RTLD_NODELETE); called once it is accepted.
  void keep_loaded() const;

 private:
  std::string path_;
  boost::dll::shared_library library_;
  const PluginManifest* manifest_ = nullptr;
};

}  // namespace tessera
