#include "tessera/pipeline_spec.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "tessera/error.h"
#include "tessera/read_file.h"
#include "tessera/registry.h"
#include "yaml/yaml_file.h"

namespace tessera {

namespace fs = std::filesystem;

std::string default_plugin(ComponentKind kind) {
  switch (kind) {
    case ComponentKind::quantizer: return "none";
    case ComponentKind::attention: return "gqa";
    case ComponentKind::cache: return "contiguous";
    case ComponentKind::scheduler: return "fcfs";
    case ComponentKind::decoder: return "sampling";
    case ComponentKind::constraint: return "grammar";
    case ComponentKind::comm: return "none";
    case ComponentKind::backend: return "auto";
  }
  return "";
}

namespace {

void merge_component(ComponentSpec& base, ComponentSpec over) {
  if (over.plugin != base.plugin) {
    base = std::move(over);  // another plugin: the base's parameters mean nothing to it
    return;
  }
  for (auto& [k, v] : over.params.items()) base.params[k] = v;
  for (auto& [k, w] : over.param_where) base.param_where[k] = w;
  base.where = over.where;
}

PipelineSpec load_root(const std::string& path, const YAML::Node& root, const std::string& canon,
                       std::set<std::string>& chain);

constexpr size_t kMaxExtendsDepth = 32;

PipelineSpec load_file(const std::string& path, std::set<std::string>& chain) {
  std::error_code ec;
  const std::string canon = fs::weakly_canonical(path, ec).string();
  const std::string text = read_file(path, "pipeline file");
  if (chain.count(canon)) throw Error(path + ": 'extends' forms a cycle");
  // Each level is a recursive call: a long chain would overflow the stack.
  if (chain.size() >= kMaxExtendsDepth) {
    throw Error(path + ": 'extends' chain is deeper than " + std::to_string(kMaxExtendsDepth) + " files");
  }
  chain.insert(canon);

  const YAML::Node root = load_yaml(path, text, "a pipeline");
  if (!root.IsMap()) throw Error(path + ": a pipeline must be a YAML map (model, backend, extends, components)");
  try {
    return load_root(path, root, canon, chain);
  } catch (const YAML::Exception& e) {  // a list or map where a name belongs (plugin: [paged], a key that is a list)
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": expected a plain value here, not a list or map (" +
                e.msg + ")");
  }
}

PipelineSpec load_root(const std::string& path, const YAML::Node& root, const std::string& canon,
                       std::set<std::string>& chain) {

  PipelineSpec spec;
  if (const YAML::Node ext = root["extends"]) {
    std::string ext_where;
    for (const auto& kv : root) {
      if (kv.first.as<std::string>() == "extends") ext_where = yaml_at_value(path, kv.first, kv.second);
    }
    if (!ext.IsScalar() || ext.Scalar().empty()) throw Error(ext_where + ": 'extends' must be a file name");
    fs::path base = ext.Scalar();
    if (base.is_relative()) base = fs::path(path).parent_path() / base;
    try {
      spec = load_file(base.string(), chain);
    } catch (const Error& e) {
      throw Error(ext_where + ": in extended pipeline: " + e.what());
    }
  } else {
    spec = default_pipeline_spec();
  }
  spec.path = path;

  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& value = kv.second;
    const std::string where = yaml_at_value(path, kv.first, value);
    if (key == "extends") continue;
    if (key == "model") {
      if (!value.IsScalar()) throw Error(where + ": 'model' must be a file path");
      fs::path model = value.Scalar();
      // Relative model paths are tried from the working directory, then from the pipeline's folder
      // and its parent (the project root for files in pipelines/).
      if (model.is_relative() && !fs::exists(model)) {
        const fs::path dir = fs::path(path).parent_path();
        for (const fs::path& cand : {dir / model, dir.parent_path() / model}) {
          if (fs::exists(cand)) {
            model = cand;
            break;
          }
        }
      }
      spec.model = model.string();
      spec.model_where = where;
    } else if (key == "backend") {
      spec.backend_where = where;
      std::string name;
      nlohmann::json params = nlohmann::json::object();
      if (value.IsScalar()) {
        name = value.Scalar();
      } else if (value.IsMap() && value["plugin"]) {
        if (value["plugin"].IsNull() || (value["plugin"].IsScalar() && value["plugin"].Scalar().empty())) {
          throw Error(where + ": backend.plugin is empty; name a backend (cpu, cuda, hip or auto)");
        }
        name = value["plugin"].as<std::string>();
        params = yaml_to_json(value);
        params.erase("plugin");
      } else {
        throw Error(where + ": 'backend' must be cpu, cuda, hip, auto or a map with 'plugin:'");
      }
      // As for components (merge_component): another backend drops the extended file's parameters,
      // the same one adds to them.
      if (name != spec.backend) spec.backend_params = nlohmann::json::object();
      for (auto& [k, v] : params.items()) spec.backend_params[k] = v;
      spec.backend = name;
    } else if (key == "kv_dtype") {
      spec.kv_dtype_where = where;
      if (!value.IsScalar()) throw Error(spec.kv_dtype_where + ": 'kv_dtype' must be f32, f16 or bf16");
      spec.kv_dtype = parse_kv_dtype(value.Scalar(), spec.kv_dtype_where);
    } else if (key == "components") {
      if (!value.IsMap()) throw Error(where + ": 'components' must be a map of kind -> {plugin: ...}");
      for (const auto& c : value) {
        const std::string kind_text = c.first.as<std::string>();
        ComponentKind kind;
        if (!parse_kind(kind_text, &kind) || kind == ComponentKind::backend) {
          throw Error(yaml_at(path, c.first) + ": unknown component kind '" + kind_text +
                      "' (expected quantizer, attention, cache, scheduler, decoder, constraint, comm)");
        }
        ComponentSpec comp;
        comp.where = yaml_at_value(path, c.first, c.second);
        if (c.second.IsScalar()) {
          comp.plugin = c.second.Scalar();  // shorthand: `attention: gqa`
        } else if (c.second.IsMap()) {
          if (!c.second["plugin"]) throw Error(comp.where + ": components." + kind_text + " needs 'plugin:'");
          for (const auto& p : c.second) {
            const std::string pk = p.first.as<std::string>();
            if (pk == "plugin") {
              if (p.second.IsNull() || (p.second.IsScalar() && p.second.Scalar().empty())) {
                throw Error(yaml_at(path, p.first) + ": components." + kind_text + ".plugin is empty; name a " + kind_text +
                            " plugin (`tessera plugins` lists them)");
              }
              comp.plugin = p.second.as<std::string>();  // a list or map throws: named by load_file
            } else {
              comp.params[pk] = yaml_to_json(p.second);
              comp.param_where[pk] = yaml_at(path, p.first);
            }
          }
        } else {
          throw Error(comp.where + ": components." + kind_text + " must be a map with 'plugin:'");
        }
        merge_component(spec.components[kind], std::move(comp));
      }
    } else if (key == "parallel") {
      spec.parallel_where = where;
      if (!value.IsMap()) throw Error(where + ": 'parallel' must be a map: { tensor: N, pipeline: M }");
      for (const auto& p : value) {
        const std::string pk = p.first.as<std::string>();
        const std::string at = yaml_at_value(path, p.first, p.second);
        int64_t n = 0;
        const nlohmann::json v = yaml_to_json(p.second);
        if (!v.is_number_integer() || (n = v.get<int64_t>()) < 1 || n > 4096) {
          throw Error(at + ": parallel." + pk + " must be a whole number of ranks from 1 to 4096, not " + v.dump());
        }
        if (pk == "tensor") {
          spec.tensor_parallel = n;
        } else if (pk == "pipeline") {
          spec.pipeline_parallel = n;
        } else {
          throw Error(yaml_at(path, p.first) + ": unknown key 'parallel." + pk + "' (parallel has tensor, pipeline)");
        }
      }
    } else if (key == "server") {
      load_server_section(path, where, value, spec.server, spec.server_where);
    } else {
      throw Error(yaml_at(path, kv.first) + ": unknown key '" + key +
                  "' (a pipeline has model, backend, kv_dtype, extends, parallel, components, server)");
    }
  }
  chain.erase(canon);
  return spec;
}

}  // namespace

DType parse_kv_dtype(const std::string& text, const std::string& where) {
  if (text == "f32") return DType::F32;
  if (text == "f16") return DType::F16;
  if (text == "bf16") return DType::BF16;
  throw Error(where + ": kv_dtype '" + text + "' is not a KV cache type (f32, f16 or bf16)");
}

const std::vector<ParamSpec>& server_params() {
  static const std::vector<ParamSpec> specs = {
      {"host", ParamType::string, "127.0.0.1", "address to bind (0.0.0.0 exposes the server to the network)", {}},
      {"port", ParamType::integer, 8080, "TCP port (0 = any free port; the bound port is printed)", {}},
      {"api_key", ParamType::string, "", "clients must send 'Authorization: Bearer KEY' (empty = no key)", {}},
      {"admin_key", ParamType::string, "",
       "the admin API's key (/admin/deployment, /admin/reload); empty = the admin API is off", {}},
      {"api_key_file", ParamType::string, "",
       "file of API keys, one per line: KEY or NAME KEY (# comments); any of them is accepted", {}},
      {"user_from_key", ParamType::boolean, false,
       "derive each request's user (prefix-cache isolation, per-user metrics) from the API key it used: NAME, or "
       "NAME/USER when it names a user; clients can then not claim another key's user", {}},
      {"max_queue", ParamType::integer, 256, "requests in the server at once (running + waiting); more get 429", {}},
      {"max_body_bytes", ParamType::size, "1MiB", "largest request body; larger ones get 413", {}},
      {"shutdown_deadline", ParamType::number, 10.0,
       "seconds SIGTERM waits for in-flight requests before cancelling them", {}},
      {"http_threads", ParamType::integer, 264,
       "threads that run requests (one holds a thread until answered): at least max_queue + 8", {}},
      {"request_deadline", ParamType::number, 30.0,
       "seconds a client has to send one request, headers and body (then 408 and the connection closes)", {}},
      {"max_connections_per_client", ParamType::integer, 512,
       "open connections per client address; more are refused with 429", {}},
      {"model_name", ParamType::string, "", "model id in /v1/models and responses (default: the file's stem)", {}},
      {"chat_template", ParamType::string, "auto",
       "auto (the GGUF's tokenizer.chat_template rendered as Jinja, else the default), jinja (that template or "
       "refuse to start), chatml, llama2, llama3, zephyr or default",
       {"auto", "jinja", "chatml", "llama2", "llama3", "zephyr", "default"}},
      {"default_max_tokens", ParamType::integer, 256, "max_tokens when a request gives none", {}},
  };
  return specs;
}

void check_server_value(const std::string& key, const nlohmann::json& value, const std::string& where) {
  struct Range {
    const char* key;
    double lo, hi;
  };
  static const Range ranges[] = {{"port", 0, 65535},
                                 {"max_queue", 1, 1e9},
                                 {"max_body_bytes", 1024, 1e12},
                                 {"shutdown_deadline", 0, 86400},
                                 {"http_threads", 1, 4096},
                                 {"request_deadline", 1, 86400},
                                 {"max_connections_per_client", 1, 1e6},
                                 {"default_max_tokens", 1, 1e9}};
  for (const Range& r : ranges) {
    if (key != r.key || !value.is_number()) continue;
    const double v = value.get<double>();
    if (v < r.lo || v > r.hi) {
      throw Error(where + ": server: '" + key + "' is " + value.dump() + "; expected " +
                  std::to_string(int64_t(r.lo)) + ".." + std::to_string(int64_t(r.hi)));
    }
  }
  if (key == "host" && value.is_string() && value.get<std::string>().empty()) {
    throw Error(where + ": server: 'host' is empty");
  }
  // An empty key would read as "no key": the server would start open to anyone.
  if ((key == "api_key" || key == "api_key_file" || key == "admin_key") && value.is_string() &&
      value.get<std::string>().empty()) {
    throw Error(where + ": server: '" + key + "' is empty; leave it out to serve without an API key");
  }
}

PipelineSpec default_pipeline_spec() {
  PipelineSpec spec;
  for (ComponentKind k : kComponentKinds) {
    ComponentSpec c;
    c.plugin = default_plugin(k);
    c.where = "(default)";
    spec.components[k] = c;
  }
  return spec;
}

PipelineSpec load_pipeline_spec(const std::string& path) {
  std::set<std::string> chain;
  return load_file(path, chain);
}

void validate_pipeline_spec(const PipelineSpec& spec, const Registry& registry) {
  for (const auto& [kind, comp] : spec.components) {
    const PluginEntry* entry = registry.find(kind, comp.plugin);
    if (entry == nullptr) {
      try {
        registry.require(kind, comp.plugin);
      } catch (const Error& e) {
        throw Error(comp.where + ": " + e.what());
      }
    }
    // Each key is checked on its own first so the error points at its line.
    for (const auto& [key, value] : comp.params.items()) {
      auto w = comp.param_where.find(key);
      const std::string where =
          (w != comp.param_where.end() ? w->second : comp.where) + ": " + std::string(kind_name(kind)) + " " + comp.plugin;
      bool declared = false;
      for (const auto& ps : entry->params) {
        if (ps.name == key) {
          declared = true;
          validate_params({ps}, nlohmann::json{{key, value}}, where);
        }
      }
      if (!declared) validate_params(entry->params, nlohmann::json{{key, value}}, where);
    }
    validate_params(entry->params, comp.params, comp.where + ": " + std::string(kind_name(kind)) + " " + comp.plugin);
  }
}

}  // namespace tessera
