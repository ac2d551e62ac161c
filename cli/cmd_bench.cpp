// tessera bench: several pipelines on one workload's request trace, with the report written as
// JSON, Markdown and HTML (see bench/ and docs/bench_schema.md).
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "tessera/bench/bench.h"
#include "tessera/error.h"

namespace tessera::cli {

namespace {

struct BenchArgs {
  bench::BenchOptions options;
  bool no_accuracy = false;
  bool quiet = false;
};

// The command line as typed, quoted where a shell needs it, for the report's reproduce line.
std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i == 0) a = "tessera";
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@") == std::string::npos;
    if (!plain) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    out += (i ? " " : "") + a;
  }
  return out;
}

int g_argc = 0;
char** g_argv = nullptr;

void bench_cmd(BenchArgs& args) {
  Registry registry;
  load_plugins(registry, args.quiet);
  args.options.accuracy = !args.no_accuracy;
  args.options.progress = !args.quiet;
  args.options.command = command_line(g_argc, g_argv);
  // Servers alone still need a tokenizer for the trace: the default pipeline, with -m when given.
  if (args.options.pipelines.empty()) args.options.trace_pipeline = resolve_pipeline_path("");
  const bench::BenchOutcome out = bench::run_bench(args.options, registry, std::cerr);
  for (const auto& f : out.files) std::cout << f << "\n";
  if (out.ran == 0) {
    std::cerr << "error: no pipeline or server ran (see " << out.files.front() << " for why)\n";
    std::exit(2);
  }
  if (out.failed > 0) {
    std::cerr << "error: " << out.failed << " of " << out.ran + out.failed
              << " pipelines/servers failed; the report lists why, and compares the others\n";
    std::exit(2);
  }
}

}  // namespace

void set_bench_command_line(int argc, char** argv) {
  g_argc = argc;
  g_argv = argv;
}

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  bench::BenchOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "bench", "Run pipelines on the identical request trace of a workload; report latency, throughput, memory, accuracy");
  auto* pipelines = cmd->add_option("--pipelines", o.pipelines, "pipeline YAML files; the first is the reference for ratios")
                       ->expected(1, -1);
  auto* servers = cmd->add_option("--server", o.servers,
                                  "OpenAI-compatible server URL (repeatable); columns after the pipelines, over streamed "
                                  "POST /v1/completions");
  cmd->add_option("--api-key", o.api_key, "bearer token for --server");
  cmd->add_option("--server-model", o.server_model, "the model field sent to --server (default: its first GET /v1/models); --model is -m, the local GGUF");
  cmd->add_flag("--server-token-prompts", o.server_token_prompts,
                "send --server prompts as token ids (exact trace) instead of decoded text");
  (void)servers;
  cmd->callback([args, pipelines, servers] {
    if (pipelines->count() == 0 && servers->count() == 0) throw CLI::RequiredError("--pipelines or --server");
    bench_cmd(*args);
  });
  cmd->add_option("--workload", o.workload, "workload YAML (e.g. configs/workloads/chat.yaml)")->required();
  cmd->add_option("--out", o.out_dir, "folder for report.json, report.md and report.html")->required();
  cmd->add_option("-m,--model", o.model, "GGUF model for every pipeline (overrides theirs)");
  cmd->add_option("--backend", o.backend, "cpu, cuda, hip or auto (overrides the pipelines)");
  cmd->add_option("--kv-dtype", o.kv_dtype, "KV cache type for every pipeline: f32, f16 or bf16 (overrides theirs)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_option("--threads", o.threads, "CPU threads (default: all cores)")->check(kNonNegative);
  cmd->add_flag("--no-accuracy", args->no_accuracy, "skip the perplexity and greedy-agreement pass");
  cmd->add_option("--accuracy-text", o.accuracy_text, "text for perplexity (default: the workload's prompt file)");
  cmd->add_option("--accuracy-ctx", o.accuracy_ctx, "perplexity chunk length in tokens (at least 4)")
      ->check(CLI::Range(int64_t(4), int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--accuracy-chunks", o.accuracy_chunks, "perplexity chunks scored at most")->check(kPositive)->capture_default_str();
  cmd->add_option("--accuracy-prompts", o.accuracy_prompts, "trace prompts for greedy agreement")->check(kPositive)->capture_default_str();
  cmd->add_option("--accuracy-tokens", o.accuracy_tokens, "tokens per prompt for greedy agreement")->check(kPositive)->capture_default_str();
  cmd->add_option("--probe-seconds", o.probe_seconds, "seconds for each machine probe (bandwidth, FMA)")
      ->check(CLI::Range(0.0, 10.0))->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "no progress on stderr");
}

}  // namespace tessera::cli
