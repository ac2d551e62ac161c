#include "cli_common.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "tessera/error.h"

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR ""
#endif

namespace tessera::cli {

namespace fs = std::filesystem;

void load_plugins(Registry& registry, bool quiet) {
  registry.load_default_paths();
  if (quiet) return;
  for (const auto& f : registry.failures()) std::cerr << "warning: " << f.message << "\n";
}

std::string resolve_pipeline_path(const std::string& given) {
  if (!given.empty()) return given;
  std::vector<fs::path> candidates = {fs::path("pipelines") / "default.yaml"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / "share" / "tessera" / "pipelines" / "default.yaml");
  if (std::string(TESSERA_SOURCE_DIR).size() > 0) {
    candidates.push_back(fs::path(TESSERA_SOURCE_DIR) / "pipelines" / "default.yaml");
  }
  for (const auto& c : candidates) {
    if (fs::exists(c)) return c.string();
  }
  std::string tried;
  for (const auto& c : candidates) tried += (tried.empty() ? "" : ", ") + c.string();
  throw Error("no pipeline given (-p) and no default pipeline found (tried " + tried + ")");
}

std::unique_ptr<Pipeline> build_pipeline(const Registry& registry, const PipelineArgs& args) {
  return build_pipeline(registry, load_pipeline_spec(resolve_pipeline_path(args.pipeline)), args);
}

PipelineOptions pipeline_options(const PipelineArgs& args) {
  PipelineOptions options;
  options.model = args.model;
  options.model_flag = args.model_flag;
  options.backend = args.backend;
  options.kv_dtype = args.kv_dtype;
  options.threads = args.threads;
  return options;
}

std::unique_ptr<Pipeline> build_pipeline(const Registry& registry, const PipelineSpec& spec, const PipelineArgs& args,
                                         ModelShare* share) {
  PipelineOptions options = pipeline_options(args);
  options.share = share;
  std::unique_ptr<Pipeline> pipeline = Pipeline::build(spec, registry, options);
  // A quantizer whose every weight fell back to float (group 128 on rows of 64, say) runs the
  // float model under its name: say so.
  const std::vector<std::string>& formats = pipeline->model().linear_formats();
  const auto fell_back = [](const std::string& f) { return f.find("(fallback") != std::string::npos; };
  const auto first_fallback = std::find_if(formats.begin(), formats.end(), fell_back);
  if (first_fallback != formats.end() && std::all_of(formats.begin(), formats.end(), Model::is_float_format)) {
    std::cerr << "warning: the quantizer quantized no weight; every one stays in float, e.g. " << *first_fallback
              << "\n";
  }
  return pipeline;
}

namespace {

CLI::Validator number_at_least(double low, bool strict, const std::string& name) {
  return CLI::Validator(
      [low, strict](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
        if (strict ? v > low : v >= low) return "";
        return "must be " + std::string(strict ? "> " : ">= ") + CLI::detail::to_string(low) + ", got " + text;
      },
      name);
}

}  // namespace

const CLI::Validator kNonNegative = number_at_least(0, false, "NONNEGATIVE");
const CLI::Validator kPositive = number_at_least(0, true, "POSITIVE");
const CLI::Validator kSeed(
    [](std::string& text) -> std::string {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec == std::errc() && end == text.data() + text.size()) return "";
      return "must be an integer in 0..18446744073709551615, got " + text;
    },
    "UINT64");

}  // namespace tessera::cli
