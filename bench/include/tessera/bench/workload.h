// A benchmark workload (YAML): request classes with prompt and output length distributions and mix
// weights, a shared system prompt, users, the arrival process, the request count and the seed.
//
//   name: chat
//   requests: 64
//   seed: 1
//   arrival: { process: poisson, rate: 8 }        # or { process: closed, concurrency: 4 }
//   users: { count: 4, distribution: zipf, s: 1.1 }
//   system_prompt: { length: 96, share: 0.5, scope: shared }   # shared | user | class
//   prompts: { source: file, path: ../shared/eval/tiny_stories_eval.txt }   # or { source: vocabulary }
//   context: reject                                # reject | clamp
//   classes:
//     - { name: chat, weight: 3, prompt: [64, 256], output: [32, 128] }
//     - { name: code, weight: 1, prompt: { mean: 128, stddev: 16, min: 96, max: 160 }, output: 300 }
//
// A class's prompt length counts its own tokens; the full prompt is BOS, then the system prompt
// (for requests that have one), then those tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::bench {

class Rng;

// A length distribution: a fixed value, uniform over [min, max], or normal clamped to [min, max].
struct LengthDist {
  enum class Kind { fixed, uniform, normal };
  Kind kind = Kind::fixed;
  int64_t min = 0;
  int64_t max = 0;
  double mean = 0;
  double stddev = 0;
  int64_t sample(Rng& rng) const;
  std::string describe() const;  // "64-256", "300", "normal(128, 16) in 96-160"
};

struct RequestClass {
  std::string name;
  double weight = 1;
  LengthDist prompt;
  LengthDist output;
  std::string where;  // file:line
};

struct SystemPrompt {
  enum class Scope { shared, user, klass };
  int64_t length = 0;  // tokens; 0 = none
  double share = 0;    // of requests that carry it
  Scope scope = Scope::shared;
  std::string where;
};
std::string scope_name(SystemPrompt::Scope s);

struct Users {
  int64_t count = 1;
  bool zipf = false;  // else uniform
  double s = 1.0;     // Zipf exponent
};

struct Arrival {
  enum class Process { poisson, closed };
  Process process = Process::closed;
  double rate = 0;          // requests per second (poisson)
  int64_t concurrency = 1;  // clients (closed loop)
  std::string describe() const;  // "poisson 8 req/s", "closed loop, 4 clients"
};

struct PromptSource {
  bool from_file = false;  // else generated from the vocabulary
  std::string path;        // resolved path of the text file
};

enum class ContextPolicy { reject, clamp };

struct Workload {
  std::string path;
  std::string name;
  std::string description;
  int64_t requests = 0;
  uint64_t seed = 0;
  Arrival arrival;
  Users users;
  SystemPrompt system;
  PromptSource prompts;
  ContextPolicy context = ContextPolicy::reject;
  bool ignore_eos = true;  // outputs follow the length distributions, not the model's EOS
  std::vector<RequestClass> classes;
};

// Reads and validates a workload file; throws Error naming the file, line and field.
Workload load_workload(const std::string& path);
// The same from text (`path` names it in messages and anchors relative prompt files).
Workload parse_workload(const std::string& text, const std::string& path);

// Checks that every class fits a model with `context` tokens (BOS + system prompt + prompt +
// output). With ContextPolicy::reject, throws Error naming the class and its lengths; with clamp,
// returns the classes that will be clamped (each as a message), and requests are cut to fit.
std::vector<std::string> check_context(const Workload& w, int64_t context, const std::string& model);

}  // namespace tessera::bench
