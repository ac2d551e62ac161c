// tessera eval: perplexity of a pipeline on a text file.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/eval.h"

namespace tessera::cli {

namespace {

struct EvalArgs {
  PipelineArgs pipeline;
  std::string text;
  int64_t ctx = 128;
  std::string format = "text";
};

void eval(const EvalArgs& args) {
  std::ifstream in(args.text, std::ios::binary);
  if (!in) throw Error(args.text + ": cannot open the text file");
  std::stringstream ss;
  ss << in.rdbuf();
  Registry registry;
  load_plugins(registry);
  auto pipeline = build_pipeline(registry, args.pipeline);
  const Tokenizer& tok = pipeline->tokenizer();
  const std::vector<int32_t> tokens = tok.encode(ss.str(), true);
  const PerplexityResult r = perplexity(*pipeline, tokens, args.ctx);
  if (args.format == "json") {
    nlohmann::json j = {{"pipeline", pipeline->describe()}, {"model", pipeline->model_path()},
                        {"text", args.text},            {"tokens", tokens.size()},
                        {"ctx", args.ctx},              {"chunks", r.chunks},
                        {"scored_tokens", r.scored_tokens}, {"perplexity", r.perplexity},
                        {"mean_nll", r.mean_nll},       {"seconds", r.seconds}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "perplexity " << r.perplexity << " (" << r.chunks << " chunks of " << args.ctx << ", "
              << r.scored_tokens << " scored tokens of " << tokens.size() << ", " << pipeline->describe() << ")\n";
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Perplexity of a pipeline on a text file");
  add_pipeline_options(*cmd, args->pipeline);
  cmd->add_option("--text", args->text, "text file to score")->required();
  cmd->add_option("--ctx", args->ctx, "chunk length in tokens")->check(CLI::PositiveNumber);
  cmd->add_option("--format", args->format, "text or json")->check(CLI::IsMember({"text", "json"}));
  cmd->callback([args] { eval(*args); });
}

}  // namespace tessera::cli
