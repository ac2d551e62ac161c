// tessera eval: perplexity of a pipeline on a text file and, with --baseline, how far it moves
// from a baseline pipeline (perplexity delta, KL divergence, teacher-forced and greedy agreement);
// with --sensitivity, which of its quantized weights are worth keeping in float.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/read_file.h"
#include "tessera/eval.h"

namespace tessera::cli {

namespace {

struct EvalArgs {
  PipelineArgs pipeline;
  std::string baseline;        // pipeline file
  std::string baseline_model;  // overrides the baseline's model (default: -m, if given)
  std::string text;
  std::string prompts_file;
  int64_t ctx = 0;  // 0: 128, or the model's context where that is shorter
  int64_t greedy_tokens = 96;
  bool sensitivity = false;
  std::string sensitivity_by = "tensor";
  std::string format = "text";
};

// Prompts for greedy agreement: a JSON list (strings, or objects with "prompt" as in the golden
// files) or a text file with one prompt per line.
std::vector<std::string> load_prompts(const std::string& path) {
  if (path.empty()) {
    return {"Once upon a time", "The little dog", "One day, a girl named", "Tom and his friend", "In the park"};
  }
  const std::string text = read_file(path, "prompts file", kTextInputLimits);
  std::vector<std::string> out;
  if (!text.empty() && (text[0] == '[' || text[0] == '{')) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(path + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
    }
    if (!j.is_array()) throw Error(path + ": expected a JSON list of prompts");
    for (const auto& item : j) {
      if (item.is_string()) out.push_back(item.get<std::string>());
      else if (item.is_object() && item.contains("prompt") && item["prompt"].is_string()) out.push_back(item["prompt"]);
      else throw Error(path + ": each prompt must be a string or an object with a \"prompt\" string, got " + item.dump());
    }
  } else {
    std::stringstream ss(text);
    std::string line;
    while (std::getline(ss, line)) {
      if (!line.empty()) out.push_back(line);
    }
  }
  if (out.empty()) throw Error(path + ": no prompts");
  return out;
}

void eval(EvalArgs args) {
  const std::string text = read_file(args.text, "text file", kTextInputLimits);
  Registry registry;
  load_plugins(registry);
  const PipelineSpec spec = load_pipeline_spec(resolve_pipeline_path(args.pipeline.pipeline));
  auto pipeline = build_pipeline(registry, spec, args.pipeline);
  if (pipeline->follow()) return;  // a tensor-parallel rank other than 0: its share of rank 0's steps
  if (args.ctx == 0) args.ctx = std::min<int64_t>(128, pipeline->max_sequence_tokens());
  const Tokenizer& tok = pipeline->tokenizer();
  const std::vector<int32_t> tokens = perplexity_tokens(tok, text);
  std::unique_ptr<Pipeline> baseline;
  if (!args.baseline.empty()) {
    PipelineArgs base_args = args.pipeline;
    base_args.pipeline = args.baseline;
    base_args.kv_dtype.clear();  // --kv-dtype is the evaluated pipeline's: the baseline keeps its own
    if (!args.baseline_model.empty()) {
      base_args.model = args.baseline_model;
      base_args.model_flag = "--baseline-model";
    }
    baseline = build_pipeline(registry, base_args);
    // Perplexities and agreement compare token ids: both models must give them the same meaning.
    const Tokenizer& base_tok = baseline->tokenizer();
    if (base_tok.vocab_size() != tok.vocab_size()) {
      throw Error("the baseline's vocabulary (" + std::to_string(base_tok.vocab_size()) + " tokens, " +
                  baseline->model_path() + ") differs from the pipeline's (" + std::to_string(tok.vocab_size()) +
                  " tokens, " + pipeline->model_path() + "): perplexities would not be comparable");
    }
    for (int32_t id = 0; id < int32_t(tok.vocab_size()); ++id) {
      if (base_tok.token_to_piece(id) != tok.token_to_piece(id)) {
        throw Error("vocabulary mismatch: token " + std::to_string(id) + " is '" + tok.token_to_piece(id) + "' in " +
                    pipeline->model_path() + " but '" + base_tok.token_to_piece(id) + "' in the baseline's " +
                    baseline->model_path() + ": perplexities would not be comparable");
      }
    }
  }
  // The greedy-agreement prompts are read and checked before any scoring: a bad file or a
  // --greedy-tokens past the context would otherwise end the run after all its work.
  std::vector<std::vector<int32_t>> prompts;
  if (baseline) {
    for (const auto& p : load_prompts(args.prompts_file)) prompts.push_back(tok.encode(p, true));
    check_greedy_agreement_fits(*pipeline, *baseline, prompts, args.greedy_tokens);
  }
  std::vector<TensorSensitivity> sensitivity;
  if (args.sensitivity) {
    // Progress on stderr: one build and perplexity run per quantized weight.
    sensitivity = keep_float_sensitivity(
        spec, registry, pipeline_options(args.pipeline), pipeline->model(), tokens, args.ctx,
        args.sensitivity_by == "kind"    ? SensitivityGroup::kind
        : args.sensitivity_by == "block" ? SensitivityGroup::block
                                         : SensitivityGroup::tensor,
        baseline.get(), [](const TensorSensitivity& t, size_t i, size_t n) {
          std::cerr << "[" << i + 1 << "/" << n << "] " << t.tensor << " in float: perplexity " << t.perplexity;
          if (t.kl_mean >= 0) std::cerr << ", KL " << t.kl_mean;
          std::cerr << "\n";
        });
    // Most helpful first: the lowest KL divergence from the baseline with the weight in float, else
    // the lowest perplexity.
    std::stable_sort(sensitivity.begin(), sensitivity.end(), [](const TensorSensitivity& a, const TensorSensitivity& b) {
      return a.kl_mean >= 0 ? a.kl_mean < b.kl_mean : a.perplexity < b.perplexity;
    });
  }
  // Against a baseline, both pipelines go through the text together (their logits side by side).
  std::optional<BaselineComparison> compared;
  if (baseline) compared = compare_with_baseline(*pipeline, *baseline, tokens, args.ctx);
  const PerplexityResult r = compared ? compared->pipeline : perplexity(*pipeline, tokens, args.ctx);

  nlohmann::json j = {{"pipeline", pipeline->describe()},  {"model", pipeline->model_path()},
                      {"weights", pipeline->model().weight_formats()},
                      {"weight_bytes", pipeline->model().weight_bytes()},
                      {"text", args.text},                {"tokens", tokens.size()},
                      {"ctx", args.ctx},                  {"chunks", r.chunks},
                      {"scored_tokens", r.scored_tokens}, {"perplexity", r.perplexity},
                      {"mean_nll", r.mean_nll},           {"seconds", r.seconds}};
  if (compared) {
    const PerplexityResult& b = compared->baseline;
    const KlDivergence& kl = compared->kl;
    const GreedyAgreement g = greedy_agreement(*pipeline, *baseline, prompts, args.greedy_tokens);
    j["baseline"] = {{"pipeline", baseline->describe()}, {"model", baseline->model_path()},
                     {"weights", baseline->model().weight_formats()},
                     {"weight_bytes", baseline->model().weight_bytes()}, {"perplexity", b.perplexity}};
    j["perplexity_delta"] = r.perplexity - b.perplexity;
    j["perplexity_delta_percent"] = 100.0 * (r.perplexity - b.perplexity) / b.perplexity;
    j["teacher_forced_agreement"] = teacher_forced_agreement(r, b);
    j["kl_divergence"] = {{"mean", kl.mean}, {"p99", kl.p99}, {"max", kl.max}, {"positions", kl.positions}};
    j["greedy_agreement"] = g.share;
    j["greedy_prefix_per_prompt"] = g.prefix;
    j["greedy_tokens_per_prompt"] = g.tokens_per_prompt;
  }

  if (args.sensitivity) {
    nlohmann::json list = nlohmann::json::array();
    for (const TensorSensitivity& t : sensitivity) {
      list.push_back({{"tensor", t.tensor},
                      {"format", t.format},
                      {"weights", t.weights},
                      {"perplexity", t.perplexity},
                      {"perplexity_change_percent", 100.0 * (t.perplexity - r.perplexity) / r.perplexity},
                      {"extra_weight_bytes", t.extra_weight_bytes}});
      if (t.kl_mean >= 0) list.back()["kl_mean"] = t.kl_mean;
    }
    j["keep_float_sensitivity"] = list;
  }
  if (args.format == "json") {
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << "perplexity " << r.perplexity << " (" << r.chunks << " chunks of " << args.ctx << ", "
            << r.scored_tokens << " scored tokens of " << tokens.size() << ", " << pipeline->describe() << ", "
            << pipeline->model().weight_formats() << ")\n";
  if (j.contains("baseline")) {
    std::cout << "baseline perplexity " << j["baseline"]["perplexity"].get<double>() << " ("
              << j["baseline"]["pipeline"].get<std::string>() << ")\n"
              << "delta " << j["perplexity_delta"].get<double>() << " (" << j["perplexity_delta_percent"].get<double>()
              << "%)\nteacher-forced agreement " << j["teacher_forced_agreement"].get<double>() << "\n"
              << "KL divergence from the baseline " << j["kl_divergence"]["mean"].get<double>() << " nats a token (p99 "
              << j["kl_divergence"]["p99"].get<double>() << ", max " << j["kl_divergence"]["max"].get<double>() << ")\n"
              << "greedy agreement " << j["greedy_agreement"].get<double>() << " (identical prefix per prompt: "
              << j["greedy_prefix_per_prompt"].dump() << " of " << args.greedy_tokens << ")\n";
  }
  if (args.sensitivity) {
    std::cout << "keep_float sensitivity: the perplexity" << (baseline ? " and KL divergence from the baseline" : "")
              << " with one more weight kept in float (most helpful first)\n";
    if (sensitivity.empty()) std::cout << "  (the quantizer quantized no weight)\n";
    for (const TensorSensitivity& t : sensitivity) {
      char line[256];
      std::snprintf(line, sizeof line, "  %-28s %-16s x%-3lld %10.4f %+8.2f%%", t.tensor.c_str(), t.format.c_str(),
                    static_cast<long long>(t.weights), t.perplexity, 100.0 * (t.perplexity - r.perplexity) / r.perplexity);
      std::cout << line;
      if (t.kl_mean >= 0) {
        std::snprintf(line, sizeof line, "  KL %.5f", t.kl_mean);
        std::cout << line;
        if (compared->kl.mean > 0) {  // a change relative to the pipeline's own KL, where it has one
          std::snprintf(line, sizeof line, " (%+.1f%%)", 100.0 * (t.kl_mean - compared->kl.mean) / compared->kl.mean);
          std::cout << line;
        }
      }
      std::snprintf(line, sizeof line, " %+12lld bytes\n", static_cast<long long>(t.extra_weight_bytes));
      std::cout << line;
    }
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Perplexity of a pipeline on a text file, optionally against a baseline");
  add_pipeline_options(*cmd, args->pipeline);
  cmd->add_option("--text", args->text, "text file to score")->required();
  cmd->add_option("--ctx", args->ctx, "chunk length in tokens (default 128, or the model's context where shorter)")
      ->check(kPositive);
  CLI::Option* baseline = cmd->add_option("--baseline", args->baseline, "baseline pipeline to compare against");
  // What only a comparison uses needs the baseline, rather than being ignored without one.
  cmd->add_option("--baseline-model", args->baseline_model, "model for the baseline (default: -m, else its own)")
      ->needs(baseline);
  cmd->add_option("--prompts", args->prompts_file,
                  "prompts for greedy agreement: JSON list (strings or {\"prompt\": ...}) or one per line")
      ->needs(baseline);
  cmd->add_option("--greedy-tokens", args->greedy_tokens, "tokens generated per prompt for greedy agreement")
      ->check(kPositive)
      ->needs(baseline);
  CLI::Option* sensitivity =
      cmd->add_flag("--sensitivity", args->sensitivity,
                    "rank the quantized weights by the perplexity (with --baseline: the KL divergence) with each one "
                    "kept in float (keep_float), and the bytes that costs: one model load and scoring per weight");
  cmd->add_option("--sensitivity-by", args->sensitivity_by,
                  "tensor (each weight), kind (*.attn_v.weight: that weight of every block) or block (blk.0.*)")
      ->check(CLI::IsMember({"tensor", "kind", "block"}))
      ->needs(sensitivity);
  cmd->add_option("--format", args->format, "text or json")->check(CLI::IsMember({"text", "json"}));
  cmd->callback([args] { eval(*args); });
}

}  // namespace tessera::cli
