// tessera plugins: every loaded plugin with its kind, name, library and parameters.
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"

namespace tessera::cli {

namespace {

void list(const std::string& format) {
  Registry registry;
  load_plugins(registry, format == "json");
  const auto entries = registry.all_entries();
  if (format == "json") {
    nlohmann::json out;
    out["plugins"] = nlohmann::json::array();
    for (const PluginEntry* e : entries) {
      nlohmann::json p;
      p["kind"] = kind_name(e->kind);
      p["name"] = e->name;
      p["doc"] = e->doc;
      p["library"] = e->library;
      p["parameters"] = nlohmann::json::array();
      for (const auto& s : e->params) {
        p["parameters"].push_back({{"name", s.name}, {"type", param_type_name(s.type)}, {"default", s.default_value},
                                   {"doc", s.doc}, {"choices", s.choices}});
      }
      out["plugins"].push_back(p);
    }
    out["failed"] = nlohmann::json::array();
    for (const auto& f : registry.failures()) out["failed"].push_back({{"library", f.library}, {"error", f.message}});
    out["search_path"] = nlohmann::json::array();
    for (const auto& d : Registry::default_search_path()) out["search_path"].push_back(d.string());
    std::cout << out.dump(2) << "\n";
    return;
  }
  for (ComponentKind kind : {ComponentKind::backend, ComponentKind::quantizer, ComponentKind::attention,
                             ComponentKind::cache, ComponentKind::scheduler, ComponentKind::decoder}) {
    for (const PluginEntry* e : registry.entries(kind)) {
      std::cout << kind_name(kind) << " " << e->name << "  — " << e->doc << "\n    library: " << e->library << "\n";
      for (const auto& s : e->params) {
        std::cout << "    " << s.name << " (" << param_type_name(s.type) << ", default "
                  << (s.default_value.is_null() ? std::string("required") : s.default_value.dump()) << "): " << s.doc
                  << "\n";
      }
    }
  }
  if (entries.empty()) {
    std::cout << "no plugins found; searched:";
    for (const auto& d : Registry::default_search_path()) std::cout << " " << d.string();
    std::cout << "\n";
  }
}

}  // namespace

void add_plugins_command(CLI::App& app) {
  auto format = std::make_shared<std::string>("text");
  CLI::App* cmd = app.add_subcommand("plugins", "List loaded plugins, their libraries and parameters");
  cmd->add_option("--format", *format, "text or json")->check(CLI::IsMember({"text", "json"}));
  cmd->callback([format] { list(*format); });
}

}  // namespace tessera::cli
