// tessera plugins: every loaded plugin with its kind, name, library and parameters.
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/model.h"

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
    out["architectures"] = supported_architectures();
    std::cout << out.dump(2) << "\n";
    return;
  }
  for (ComponentKind kind : {ComponentKind::backend, ComponentKind::quantizer, ComponentKind::attention,
                             ComponentKind::cache, ComponentKind::scheduler, ComponentKind::decoder,
                             ComponentKind::constraint, ComponentKind::comm}) {
    for (const PluginEntry* e : registry.entries(kind)) {
      std::cout << kind_name(kind) << " " << e->name << "  — " << e->doc << "\n    library: " << e->library << "\n";
      for (const auto& s : e->params) {
        std::cout << "    " << s.name << " (" << param_type_name(s.type) << ", default "
                  << (s.default_value.is_null() ? std::string("required") : s.default_value.dump()) << "): " << s.doc
                  << "\n";
      }
    }
  }
  std::cout << "model architectures (core):";
  for (const auto& a : supported_architectures()) std::cout << " " << a;
  std::cout << "\n";
  if (entries.empty()) {
    std::cout << "no plugins found; searched:";
    for (const auto& d : Registry::default_search_path()) std::cout << " " << d.string();
    std::cout << "\n";
  }
}

// Markdown table cells: keep each on one line and escape the column separator.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

// The reference of every plugin's parameters (docs/pipelines.md is generated from it). Nothing in it
// depends on the machine (no library paths), and a library that fails to load is an error rather
// than a silently missing section.
void markdown() {
  Registry registry;
  load_plugins(registry, true);
  if (!registry.failures().empty()) {
    std::string msg = "cannot document every plugin:";
    for (const auto& f : registry.failures()) msg += "\n  " + f.message;
    throw Error(msg);
  }
  for (ComponentKind kind : {ComponentKind::quantizer, ComponentKind::attention, ComponentKind::cache,
                             ComponentKind::scheduler, ComponentKind::decoder, ComponentKind::constraint,
                             ComponentKind::comm, ComponentKind::backend}) {
    auto entries = registry.entries(kind);
    std::sort(entries.begin(), entries.end(), [](const PluginEntry* a, const PluginEntry* b) { return a->name < b->name; });
    const std::string k(kind_name(kind));
    std::cout << "## " << k << "\n\n";
    if (kind == ComponentKind::backend) {
      std::cout << "Chosen by `backend: NAME` or `backend: { plugin: NAME, ... }`.\n\n";
    } else {
      std::cout << "Chosen by `components: { " << k << ": { plugin: NAME, ... } }`.\n\n";
    }
    if (entries.empty()) std::cout << "No " << k << " plugin is installed.\n\n";
    for (const PluginEntry* e : entries) {
      std::cout << "### `" << e->name << "`\n\n" << e->doc << "\n\n";
      if (e->params.empty()) {
        std::cout << "No parameters.\n\n";
        continue;
      }
      std::cout << "| parameter | type | default | description |\n|---|---|---|---|\n";
      for (const auto& s : e->params) {
        std::string type(param_type_name(s.type));
        if (!s.choices.empty()) {
          type += ": ";
          for (size_t i = 0; i < s.choices.size(); ++i) type += (i ? ", `" : "`") + s.choices[i] + "`";
        }
        const std::string def = s.default_value.is_null() ? "required" : "`" + s.default_value.dump() + "`";
        std::cout << "| `" << s.name << "` | " << cell(type) << " | " << cell(def) << " | " << cell(s.doc) << " |\n";
      }
      std::cout << "\n";
    }
  }
}

}  // namespace

void add_plugins_command(CLI::App& app) {
  auto format = std::make_shared<std::string>("text");
  CLI::App* cmd = app.add_subcommand("plugins", "List loaded plugins, their libraries and parameters");
  cmd->add_option("--format", *format,
                  "text, json, or markdown (the parameter reference of docs/pipelines.md; see scripts/gen_docs.sh)")
      ->check(CLI::IsMember({"text", "json", "markdown"}));
  cmd->callback([format] {
    if (*format == "markdown") {
      markdown();
    } else {
      list(*format);
    }
  });
}

}  // namespace tessera::cli
