#pragma once

#include <CLI/CLI.hpp>

#include "cli_common.h"

namespace tessera::cli {

// Each adds a subcommand whose callback does the work (errors propagate as tessera::Error).
void add_run_command(CLI::App& app);
void add_plugins_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
// The bench records the command line it was started with (for its reproduce line).
void set_bench_command_line(int argc, char** argv);

// The options every pipeline-building command shares.
void add_pipeline_options(CLI::App& cmd, PipelineArgs& args);

// Number checks with short messages (CLI11's own print the range up to the largest double).
extern const CLI::Validator kNonNegative;  // >= 0
extern const CLI::Validator kPositive;     // > 0
extern const CLI::Validator kSeed;         // an integer in 0..2^64-1 (CLI11 saturates larger ones)

}  // namespace tessera::cli
