// Shared by the tessera subcommands: finding plugins and pipelines, and building a pipeline.
#pragma once

#include <memory>
#include <string>

#include "tessera/pipeline.h"
#include "tessera/registry.h"

namespace tessera::cli {

struct PipelineArgs {
  std::string pipeline;  // -p; empty = pipelines/default.yaml
  std::string model;     // -m
  std::string model_flag = "-m";  // the option that gave `model`, named in its errors
  std::string backend;   // --backend
  std::string kv_dtype;  // --kv-dtype
  int threads = 0;       // --threads
};

// Loads plugins from the default search path; prints libraries that were refused to stderr.
void load_plugins(Registry& registry, bool quiet = false);
// -p as given, else pipelines/default.yaml from the working directory, the install share folder or
// the source tree.
std::string resolve_pipeline_path(const std::string& given);
std::unique_ptr<Pipeline> build_pipeline(const Registry& registry, const PipelineArgs& args);
// The same from a spec already loaded (-p is then ignored); with `share`, weights loaded there once
// serve every pipeline that matches (PipelineOptions::share).
std::unique_ptr<Pipeline> build_pipeline(const Registry& registry, const PipelineSpec& spec, const PipelineArgs& args,
                                         ModelShare* share = nullptr);
// The options build_pipeline builds with (-m, --backend, --kv-dtype, --threads).
PipelineOptions pipeline_options(const PipelineArgs& args);

}  // namespace tessera::cli
