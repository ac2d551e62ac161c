// A pipeline file (YAML): which plugin serves each component kind, with its parameters.
//
//   model: ../shared/models/stories260K/stories260K-f32.gguf
//   backend: auto                      # cpu | cuda | hip | auto
//   kv_dtype: f16                      # optional: KV cache element type, f32 (default) | f16 | bf16
//   extends: baseline.yaml             # optional: start from another pipeline, then override
//   components:
//     quantizer: { plugin: none }
//     attention: { plugin: gqa }
//     cache:     { plugin: contiguous, max_seqs: 8 }
//     scheduler: { plugin: fcfs }
//     decoder:   { plugin: sampling, temperature: 0 }
//   parallel: { tensor: 2 }            # optional: ranks of the comm component sharing each layer
//   server:                            # optional: settings of `tessera serve` (see server_params())
//     port: 8080
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/component.h"
#include "tessera/dtype.h"
#include "tessera/params.h"

namespace tessera {

class Registry;

struct ComponentSpec {
  std::string plugin;
  nlohmann::json params = nlohmann::json::object();
  std::string where;                               // "file:line" of the component
  std::map<std::string, std::string> param_where;  // "file:line" of each parameter
};

struct PipelineSpec {
  std::string path;  // the file it was read from ("" for built-in defaults)
  std::string model;
  std::string model_where;
  std::string backend = "auto";
  nlohmann::json backend_params = nlohmann::json::object();
  std::string backend_where;
  DType kv_dtype = DType::F32;  // the KV cache's element type (f32, f16 or bf16)
  std::string kv_dtype_where;
  // `parallel: { tensor: N, pipeline: M }`: N ranks share each layer (Megatron-style tensor
  // parallelism over the `comm` component's ranks); M pipeline stages (not built yet: refused).
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  std::string parallel_where;
  std::map<ComponentKind, ComponentSpec> components;  // every kind present after loading
  // The `server:` section: only the keys the file gives, checked against server_params() (types and
  // ranges) when loaded; `extends` merges it key by key.
  nlohmann::json server = nlohmann::json::object();
  std::map<std::string, std::string> server_where;  // "file:line" of each key
};

// The keys of the `server:` section, with their types, defaults and docs.
const std::vector<ParamSpec>& server_params();
// Checks one server setting's range (port 0..65535, counts >= 1 ...); throws Error naming `where`,
// the key and the value. Used for the file and for command-line overrides alike.
void check_server_value(const std::string& key, const nlohmann::json& value, const std::string& where);

// "f32", "f16" or "bf16" as a KV cache type; throws Error naming `where` and the value otherwise.
DType parse_kv_dtype(const std::string& text, const std::string& where);

// Built-in defaults for kinds a file leaves out.
std::string default_plugin(ComponentKind kind);

// Reads a pipeline file, following `extends:`; throws Error naming the file and line.
PipelineSpec load_pipeline_spec(const std::string& path);
// The defaults alone (no file).
PipelineSpec default_pipeline_spec();
// Checks plugin names and parameters against what the registry declares; throws Error with the
// file and line of the offending key.
void validate_pipeline_spec(const PipelineSpec& spec, const Registry& registry);

}  // namespace tessera
