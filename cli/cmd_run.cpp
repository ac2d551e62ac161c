// tessera run: generate text for one or more prompts (batched through the engine).
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "tessera/decoder.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/read_file.h"

namespace tessera::cli {

void add_pipeline_options(CLI::App& cmd, PipelineArgs& args) {
  cmd.add_option("-p,--pipeline", args.pipeline, "pipeline YAML (default: pipelines/default.yaml)");
  cmd.add_option("-m,--model", args.model, "GGUF model file (overrides the pipeline's model)");
  cmd.add_option("--backend", args.backend, "cpu, cuda, hip or auto (overrides the pipeline)");
  cmd.add_option("--kv-dtype", args.kv_dtype, "KV cache type: f32, f16 or bf16 (overrides the pipeline's kv_dtype)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd.add_option("--threads", args.threads, "CPU threads (default: all cores)")->check(kNonNegative);
}

namespace {

struct RunArgs {
  PipelineArgs pipeline;
  std::vector<std::string> prompts;
  int64_t max_tokens = 96;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<double> frequency_penalty;
  std::optional<double> presence_penalty;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::optional<int64_t> logprobs;  // absent: none reported; 0: the chosen token's; N: and N alternatives
  std::string format = "text";
  bool ignore_eos = false;
  std::string json_schema, grammar, regex;  // structured output: a file (schema, GBNF) or a pattern
  bool json = false;                        // any JSON object
};

// The output constraint the flags ask for (at most one), compiled against the model's vocabulary.
std::shared_ptr<const CompiledConstraint> run_constraint(const RunArgs& args, const Pipeline& pipeline) {
  std::vector<ConstraintSpec> specs;
  if (!args.json_schema.empty())
    specs.push_back({"json_schema", read_file(args.json_schema, "--json-schema"), args.json_schema});
  if (!args.grammar.empty()) specs.push_back({"grammar", read_file(args.grammar, "--grammar"), args.grammar});
  if (!args.regex.empty()) specs.push_back({"regex", args.regex, "--regex"});
  if (args.json) specs.push_back({"json_object", "", "--json"});
  if (specs.empty()) return nullptr;
  if (specs.size() > 1) throw Error("--json-schema, --grammar, --regex and --json: give at most one");
  return pipeline.constraint().compile(specs[0]);
}

double rate(double count, double seconds) { return seconds > 0 ? count / seconds : 0.0; }

void run(const RunArgs& args) {
  Registry registry;
  load_plugins(registry);
  std::unique_ptr<Pipeline> pipeline = build_pipeline(registry, args.pipeline);
  if (pipeline->follow()) return;  // a tensor-parallel rank other than 0: its share of rank 0's steps
  Engine engine(*pipeline);
  const Tokenizer& tok = pipeline->tokenizer();

  SamplingParams sampling = pipeline->decoder().default_params();
  if (args.temperature) sampling.temperature = *args.temperature;
  if (args.top_k) sampling.top_k = *args.top_k;
  if (args.top_p) sampling.top_p = *args.top_p;
  if (args.min_p) sampling.min_p = *args.min_p;
  if (args.repetition_penalty) sampling.repetition_penalty = *args.repetition_penalty;
  if (args.frequency_penalty) sampling.frequency_penalty = *args.frequency_penalty;
  if (args.presence_penalty) sampling.presence_penalty = *args.presence_penalty;
  if (args.seed) sampling.seed = *args.seed;
  if (args.logprobs) sampling.logprobs = *args.logprobs;
  validate_sampling(sampling);  // ranges first: they name the flag's value
  if (args.logprobs && *args.logprobs >= 0 && args.format != "json") {  // out of range: named below
    throw Error("--logprobs: log-probabilities are reported in JSON output; add --format json");
  }
  validate_sampling(sampling);  // names the field and value of a bad flag

  std::vector<std::string> prompts = args.prompts;
  if (prompts.empty()) prompts.push_back("");  // generate from BOS alone
  const bool stream = args.format == "text" && prompts.size() == 1;
  const std::shared_ptr<const CompiledConstraint> constraint = run_constraint(args, *pipeline);
  std::vector<RequestId> ids;
  for (const auto& text : prompts) {
    GenerationRequest req;
    req.prompt = tok.encode(text, true);
    if (req.prompt.empty()) req.prompt.push_back(tok.bos());
    req.max_tokens = args.max_tokens;
    req.sampling = sampling;
    req.ignore_eos = args.ignore_eos;
    req.stop = args.stop;
    req.constraint = constraint;
    if (stream) req.on_text = [](RequestId, std::string_view t) { std::cout << t << std::flush; };
    ids.push_back(engine.submit(std::move(req)));  // refuses a prompt the context cannot hold
    if (stream) std::cout << text << std::flush;  // echoed once accepted, before the first token
  }
  engine.run_until_idle();
  std::vector<GenerationResult> results = engine.take_finished();
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });

  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& r = results[i];
    const Model& model = pipeline->model();
    // A request that ends before its first token (-n 0, an error) has no prefill or decode timing.
    const double prefill_s = r.tokens.empty() ? 0.0 : r.first_token - r.admitted;
    const double decode_s = r.tokens.size() < 2 ? 0.0 : r.finished - r.first_token;
    const double prefill_tps = rate(double(r.prompt.size()), prefill_s);
    const double decode_tps = rate(double(r.tokens.size()) - 1, decode_s);
    if (args.format == "json") {
      nlohmann::json j;
      j["prompt"] = prompts[i];
      j["prompt_token_ids"] = r.prompt;
      j["completion_token_ids"] = r.tokens;
      j["completion_text"] = r.text;
      if (args.logprobs) {
        j["logprobs"] = r.logprobs;
        if (*args.logprobs > 0) {
          nlohmann::json top = nlohmann::json::array();
          for (const auto& alternatives : r.top_logprobs) {
            nlohmann::json one = nlohmann::json::array();
            for (const TokenLogprob& a : alternatives) {
              one.push_back({{"token", a.token}, {"text", tok.token_to_piece(a.token)}, {"logprob", a.logprob}});
            }
            top.push_back(std::move(one));
          }
          j["top_logprobs"] = std::move(top);
        }
      }
      j["finish_reason"] = finish_reason_name(r.reason);
      if (!r.error.empty()) j["error"] = r.error;
      j["timings"] = {{"prefill_seconds", prefill_s},
                      {"decode_seconds", decode_s},
                      {"prefill_tokens_per_s", prefill_tps},
                      {"decode_tokens_per_s", decode_tps},
                      {"ttft_ms", r.ttft() * 1000.0},
                      {"queue_ms", r.queue_time() * 1000.0},
                      // Roofline figures: compare with the machine's FMA peak and read bandwidth.
                      {"prefill_gflop_per_s", rate(2.0 * double(model.layer_macs_per_token() * int64_t(r.prompt.size()) +
                                                                model.head_macs()) / 1e9, prefill_s)},
                      {"decode_weight_gb_per_s", double(model.decode_bytes_per_token()) * decode_tps / 1e9}};
      j["tokens_in"] = r.prompt.size();
      j["tokens_out"] = r.tokens.size();
      j["pipeline"] = pipeline->describe();
      j["model"] = pipeline->model_path();
      j["architecture"] = model.config().architecture;
      j["tokenizer"] = tok.vocabulary().model;
      j["weight_bytes"] = model.weight_bytes();
      j["weights"] = model.weight_formats();
      j["weight_bytes_per_token"] = model.decode_bytes_per_token();
      // Generated text may end inside a UTF-8 sequence: replace what cannot be encoded.
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      if (!stream) std::cout << prompts[i] << r.text;
      std::cout << "\n";
      std::cerr << "[" << r.prompt.size() << " prompt tokens at " << static_cast<int64_t>(prefill_tps)
                << " tok/s, " << r.tokens.size() << " generated at " << static_cast<int64_t>(decode_tps)
                << " tok/s, finish: " << finish_reason_name(r.reason)
                << (r.reason == FinishReason::length && int64_t(r.tokens.size()) < args.max_tokens
                        ? " (full: " + pipeline->sequence_limit_text() + ")"
                        : "")
                << "]\n";
      if (!r.error.empty()) std::cerr << "error: " << r.error << "\n";
      if (i + 1 < results.size()) std::cout << "\n";
    }
  }
  if (pipeline->decoder().speculator() != nullptr) {
    const SpeculationStats s = engine.stats().speculation;
    if (args.format == "json") {
      nlohmann::json j;
      j["speculation"] = {{"proposed", s.proposed},
                          {"accepted", s.accepted},
                          {"acceptance_rate", s.acceptance_rate()},
                          {"mean_accepted_length", s.mean_accepted_length()},
                          {"draft_time_share", s.draft_time_share()}};
      std::cout << j.dump() << "\n";
    } else {
      std::cerr << "[speculation: " << s.accepted << " of " << s.proposed << " drafts accepted ("
                << int(100 * s.acceptance_rate()) << "%), " << s.mean_accepted_length()
                << " per verification, " << int(100 * s.draft_time_share()) << "% of the time drafting]\n";
    }
  }
  for (const auto& r : results) {
    if (r.reason == FinishReason::error) throw Error("a request failed: " + r.error);
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from prompts with a pipeline");
  add_pipeline_options(*cmd, args->pipeline);
  cmd->add_option("--prompt", args->prompts, "prompt text (repeatable; the prompts run as one batch)");
  cmd->add_option("prompts", args->prompts, "prompt text (same as --prompt)");
  cmd->add_option("-n,--max-tokens", args->max_tokens, "tokens to generate per prompt")->check(kNonNegative);
  cmd->add_option("--temperature", args->temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", args->top_k, "keep the k most likely tokens (0 = off)")->check(kNonNegative);
  cmd->add_option("--top-p", args->top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", args->min_p, "drop tokens below min_p x the top probability (0 = off)");
  cmd->add_option("--repetition-penalty", args->repetition_penalty,
                  "divide logits of tokens in prompt and output (1 = off)");
  cmd->add_option("--frequency-penalty", args->frequency_penalty,
                  "subtract this x the count of each generated token (-2..2)");
  cmd->add_option("--presence-penalty", args->presence_penalty, "subtract this from each generated token (-2..2)");
  cmd->add_option("--seed", args->seed,
                  "random seed for sampling (default: the pipeline decoder's, so a run repeats; every prompt of a "
                  "run starts from it)")
      ->check(kSeed);
  cmd->add_option("--stop", args->stop, "stop string (repeatable); the text ends before it")
      ->allow_extra_args(false);  // one string per --stop, so a prompt can follow
  cmd->add_option("--logprobs", args->logprobs,
                  "report each generated token's log-probability and N alternatives (0..20; JSON output)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past the end-of-sequence token");
  cmd->add_option("--json-schema", args->json_schema, "JSON Schema file: the output is JSON valid under it");
  cmd->add_option("--grammar", args->grammar, "GBNF grammar file (llama.cpp's format): the output is a sentence of it");
  cmd->add_option("--regex", args->regex, "the whole output matches this regular expression");
  cmd->add_flag("--json", args->json, "the output is a JSON object");
  cmd->add_option("--format", args->format, "text or json (one JSON object per prompt, per line)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([args] { run(*args); });
}

}  // namespace tessera::cli
