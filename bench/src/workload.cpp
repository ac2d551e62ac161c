#include "tessera/bench/workload.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "tessera/bench/rng.h"
#include "tessera/error.h"
#include "tessera/read_file.h"

namespace tessera::bench {

namespace fs = std::filesystem;

int64_t LengthDist::sample(Rng& rng) const {
  switch (kind) {
    case Kind::fixed: return min;
    case Kind::uniform: return rng.uniform_int(min, max);
    case Kind::normal: {
      const double v = std::round(rng.normal(mean, stddev));
      return std::clamp<int64_t>(int64_t(v), min, max);
    }
  }
  return min;
}

std::string LengthDist::describe() const {
  auto num = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  switch (kind) {
    case Kind::fixed: return std::to_string(min);
    case Kind::uniform: return std::to_string(min) + "-" + std::to_string(max);
    case Kind::normal:
      return "normal(" + num(mean) + ", " + num(stddev) + ") in " + std::to_string(min) + "-" + std::to_string(max);
  }
  return "";
}

std::string scope_name(SystemPrompt::Scope s) {
  switch (s) {
    case SystemPrompt::Scope::shared: return "shared";
    case SystemPrompt::Scope::user: return "user";
    case SystemPrompt::Scope::klass: return "class";
  }
  return "";
}

std::string Arrival::describe() const {
  std::ostringstream s;
  if (process == Process::poisson) {
    s << "poisson " << rate << " req/s";
  } else {
    s << "closed loop, " << concurrency << (concurrency == 1 ? " client" : " clients");
  }
  return s.str();
}

namespace {

// Every message starts with file:line of the node it is about (yaml-cpp marks).
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  std::string at(const YAML::Node& n) const {
    return path_ + ":" + std::to_string(n.Mark().line + 1);
  }
  [[noreturn]] void fail(const YAML::Node& n, const std::string& msg) const { throw Error(at(n) + ": " + msg); }

  void only_keys(const YAML::Node& map, const std::string& what, std::set<std::string> allowed) const {
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(kv.first, "unknown key '" + key + "' in " + what + " (expected one of: " + list + ")");
      }
    }
  }
  void need_map(const YAML::Node& n, const std::string& what) const {
    if (!n.IsMap()) fail(n, "'" + what + "' must be a map");
  }

  int64_t integer(const YAML::Node& n, const std::string& what, int64_t lo) const {
    if (!n.IsScalar()) fail(n, "'" + what + "' must be an integer");
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(n.Scalar(), &used);
      if (used != n.Scalar().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      fail(n, "'" + what + "' must be an integer, got '" + n.Scalar() + "'");
    }
    if (v < lo) fail(n, "'" + what + "' must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
    return v;
  }
  double number(const YAML::Node& n, const std::string& what, double lo, bool lo_open) const {
    if (!n.IsScalar()) fail(n, "'" + what + "' must be a number");
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(n.Scalar(), &used);
      if (used != n.Scalar().size() || !std::isfinite(v)) throw std::invalid_argument("bad");
    } catch (const std::exception&) {
      fail(n, "'" + what + "' must be a number, got '" + n.Scalar() + "'");
    }
    if (lo_open ? v <= lo : v < lo) {
      std::ostringstream s;
      s << "'" << what << "' must be " << (lo_open ? "> " : ">= ") << lo << ", got " << n.Scalar();
      fail(n, s.str());
    }
    return v;
  }
  std::string text(const YAML::Node& n, const std::string& what) const {
    if (!n.IsScalar()) fail(n, "'" + what + "' must be a string");
    return n.Scalar();
  }
  std::string choice(const YAML::Node& n, const std::string& what, const std::vector<std::string>& choices) const {
    const std::string v = text(n, what);
    std::string list;
    for (const auto& c : choices) {
      if (c == v) return v;
      list += (list.empty() ? "" : ", ") + c;
    }
    fail(n, "'" + what + "' must be one of " + list + ", got '" + v + "'");
  }
  bool boolean(const YAML::Node& n, const std::string& what) const {
    const std::string v = text(n, what);
    if (v == "true" || v == "True" || v == "yes") return true;
    if (v == "false" || v == "False" || v == "no") return false;
    fail(n, "'" + what + "' must be true or false, got '" + v + "'");
  }

  // 128 (fixed), [64, 256] (uniform), or a map {min, max} / {mean, stddev, min, max} / {value}.
  LengthDist length(const YAML::Node& n, const std::string& what) const {
    LengthDist d;
    if (n.IsScalar()) {
      d.kind = LengthDist::Kind::fixed;
      d.min = d.max = integer(n, what, 1);
    } else if (n.IsSequence()) {
      if (n.size() != 2) fail(n, "'" + what + "' as a list must be [min, max]");
      d.kind = LengthDist::Kind::uniform;
      d.min = integer(n[0], what + " min", 1);
      d.max = integer(n[1], what + " max", 1);
    } else if (n.IsMap()) {
      only_keys(n, what, {"value", "min", "max", "mean", "stddev"});
      if (n["value"]) {
        d.kind = LengthDist::Kind::fixed;
        d.min = d.max = integer(n["value"], what + ".value", 1);
      } else if (n["mean"]) {
        d.kind = LengthDist::Kind::normal;
        d.mean = number(n["mean"], what + ".mean", 1, false);
        if (!n["stddev"]) fail(n, "'" + what + "' with a mean needs a stddev");
        d.stddev = number(n["stddev"], what + ".stddev", 0, false);
        if (!n["min"] || !n["max"]) fail(n, "'" + what + "' with a mean needs min and max (the clamp)");
        d.min = integer(n["min"], what + ".min", 1);
        d.max = integer(n["max"], what + ".max", 1);
        if (d.mean < double(d.min) || d.mean > double(d.max)) {
          fail(n["mean"], "'" + what + ".mean' must lie within min-max (" + std::to_string(d.min) + "-" +
                              std::to_string(d.max) + ")");
        }
      } else {
        if (!n["min"] || !n["max"]) fail(n, "'" + what + "' needs min and max, a mean, or a value");
        d.kind = LengthDist::Kind::uniform;
        d.min = integer(n["min"], what + ".min", 1);
        d.max = integer(n["max"], what + ".max", 1);
      }
    } else {
      fail(n, "'" + what + "' must be a length: 128, [64, 256] or {min, max, mean, stddev}");
    }
    if (d.max < d.min) {
      fail(n, "'" + what + "' has max " + std::to_string(d.max) + " below min " + std::to_string(d.min));
    }
    return d;
  }

  // Relative files are tried from the working directory, then from the workload's folder and the
  // two above it (the project root for files in configs/workloads/), like pipeline model paths.
  std::string resolve(const YAML::Node& n, const std::string& given) const {
    fs::path p = given;
    if (p.is_relative() && !fs::exists(p)) {
      fs::path dir = fs::path(path_).parent_path();
      for (int up = 0; up < 3; ++up) {
        if (fs::exists(dir / p)) return (dir / p).string();
        dir = dir.parent_path();
      }
    }
    if (!fs::exists(p)) fail(n, "prompt text file '" + given + "' not found");
    return p.string();
  }

 private:
  std::string path_;
};

}  // namespace

Workload parse_workload(const std::string& text, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  Reader r(path);
  if (!root.IsMap()) throw Error(path + ": a workload must be a YAML map (name, requests, arrival, classes, ...)");
  r.only_keys(root, "the workload", {"name", "description", "requests", "seed", "arrival", "users", "system_prompt",
                                     "prompts", "context", "ignore_eos", "classes"});
  Workload w;
  w.path = path;
  w.name = root["name"] ? r.text(root["name"], "name") : fs::path(path).stem().string();
  if (root["description"]) w.description = r.text(root["description"], "description");
  if (!root["requests"]) throw Error(path + ": 'requests' (how many requests the trace has) is required");
  w.requests = r.integer(root["requests"], "requests", 1);
  // The trace and every request's record are held in memory until the report is written.
  constexpr int64_t kMaxRequests = 1000000;
  if (w.requests > kMaxRequests) {
    r.fail(root["requests"], "'requests' is " + std::to_string(w.requests) + "; a trace holds at most " +
                                 std::to_string(kMaxRequests) + " (each is kept until the report is written)");
  }
  if (root["seed"]) w.seed = uint64_t(r.integer(root["seed"], "seed", 0));
  if (root["ignore_eos"]) w.ignore_eos = r.boolean(root["ignore_eos"], "ignore_eos");
  if (root["context"]) {
    w.context = r.choice(root["context"], "context", {"reject", "clamp"}) == "clamp" ? ContextPolicy::clamp
                                                                                      : ContextPolicy::reject;
  }

  if (!root["arrival"]) throw Error(path + ": 'arrival' is required ({process: poisson, rate: R} or {process: closed, concurrency: N})");
  const YAML::Node a = root["arrival"];
  r.need_map(a, "arrival");
  r.only_keys(a, "arrival", {"process", "rate", "concurrency"});
  if (!a["process"]) r.fail(a, "'arrival' needs 'process: poisson' or 'process: closed'");
  if (r.choice(a["process"], "arrival.process", {"poisson", "closed"}) == "poisson") {
    w.arrival.process = Arrival::Process::poisson;
    if (!a["rate"]) r.fail(a, "a poisson arrival needs 'rate' (requests per second)");
    if (a["concurrency"]) r.fail(a["concurrency"], "'concurrency' belongs to a closed loop, not a poisson arrival");
    w.arrival.rate = r.number(a["rate"], "arrival.rate", 0, true);
    // A rate that spreads the trace over more than a day is a typo (per minute for per second?),
    // not a benchmark: refused here rather than waited out.
    constexpr double kMaxTraceSeconds = 86400;
    if (double(w.requests) / w.arrival.rate > kMaxTraceSeconds) {
      r.fail(a["rate"], "'arrival.rate' " + a["rate"].Scalar() + " requests a second spreads " +
                            std::to_string(w.requests) + " requests over about " +
                            std::to_string(int64_t(double(w.requests) / w.arrival.rate)) +
                            " s, more than a day; the rate is in requests per second");
    }
  } else {
    w.arrival.process = Arrival::Process::closed;
    if (!a["concurrency"]) r.fail(a, "a closed-loop arrival needs 'concurrency' (clients)");
    if (a["rate"]) r.fail(a["rate"], "'rate' belongs to a poisson arrival, not a closed loop");
    w.arrival.concurrency = r.integer(a["concurrency"], "arrival.concurrency", 1);
  }

  if (const YAML::Node u = root["users"]) {
    r.need_map(u, "users");
    r.only_keys(u, "users", {"count", "distribution", "s"});
    if (u["count"]) w.users.count = r.integer(u["count"], "users.count", 1);
    if (u["distribution"]) w.users.zipf = r.choice(u["distribution"], "users.distribution", {"uniform", "zipf"}) == "zipf";
    if (u["s"]) {
      if (!w.users.zipf) r.fail(u["s"], "'s' (the Zipf exponent) needs 'distribution: zipf'");
      w.users.s = r.number(u["s"], "users.s", 0, true);
    }
  }

  if (const YAML::Node s = root["system_prompt"]) {
    r.need_map(s, "system_prompt");
    r.only_keys(s, "system_prompt", {"length", "share", "scope"});
    w.system.where = r.at(s);
    if (!s["length"]) r.fail(s, "'system_prompt' needs 'length' (tokens)");
    w.system.length = r.integer(s["length"], "system_prompt.length", 1);
    w.system.share = 1.0;
    if (s["share"]) {
      w.system.share = r.number(s["share"], "system_prompt.share", 0, false);
      if (w.system.share > 1) r.fail(s["share"], "'system_prompt.share' is a fraction of requests (0-1), got " + s["share"].Scalar());
    }
    if (s["scope"]) {
      const std::string scope = r.choice(s["scope"], "system_prompt.scope", {"shared", "user", "class"});
      w.system.scope = scope == "user" ? SystemPrompt::Scope::user
                       : scope == "class" ? SystemPrompt::Scope::klass
                                          : SystemPrompt::Scope::shared;
    }
  }

  if (const YAML::Node p = root["prompts"]) {
    r.need_map(p, "prompts");
    r.only_keys(p, "prompts", {"source", "path"});
    const std::string source = p["source"] ? r.choice(p["source"], "prompts.source", {"vocabulary", "file"})
                                           : std::string(p["path"] ? "file" : "vocabulary");
    if (source == "file") {
      if (!p["path"]) r.fail(p, "'prompts' from a file needs 'path'");
      w.prompts.from_file = true;
      w.prompts.path = r.resolve(p["path"], r.text(p["path"], "prompts.path"));
    } else if (p["path"]) {
      r.fail(p["path"], "'path' needs 'source: file'");
    }
  }

  const YAML::Node classes = root["classes"];
  if (!classes || !classes.IsSequence() || classes.size() == 0) {
    throw Error((classes ? r.at(classes) : path) + ": 'classes' must be a non-empty list of request classes");
  }
  std::set<std::string> names;
  for (const auto& c : classes) {
    r.need_map(c, "classes entry");
    r.only_keys(c, "a request class", {"name", "weight", "prompt", "output"});
    RequestClass rc;
    rc.where = r.at(c);
    if (!c["name"]) r.fail(c, "a request class needs a 'name'");
    rc.name = r.text(c["name"], "name");
    if (!names.insert(rc.name).second) r.fail(c["name"], "request class '" + rc.name + "' is declared twice");
    if (c["weight"]) rc.weight = r.number(c["weight"], rc.name + ".weight", 0, true);
    if (!c["prompt"]) r.fail(c, "request class '" + rc.name + "' needs a 'prompt' length");
    if (!c["output"]) r.fail(c, "request class '" + rc.name + "' needs an 'output' length");
    rc.prompt = r.length(c["prompt"], rc.name + ".prompt");
    rc.output = r.length(c["output"], rc.name + ".output");
    w.classes.push_back(std::move(rc));
  }
  return w;
}

Workload load_workload(const std::string& path) { return parse_workload(read_file(path, "workload file"), path); }

std::vector<std::string> check_context(const Workload& w, int64_t context, const std::string& model) {
  std::vector<std::string> clamped;
  for (const auto& c : w.classes) {
    const int64_t system = w.system.share > 0 ? w.system.length : 0;
    const int64_t longest = 1 + system + c.prompt.max + c.output.max;
    if (longest <= context) continue;
    const std::string msg = "request class '" + c.name + "' (" + c.where + ") asks for up to " +
                            std::to_string(c.prompt.max) + " prompt + " + std::to_string(c.output.max) +
                            " output tokens" + (system > 0 ? " + " + std::to_string(system) + " system prompt" : "") +
                            " + BOS = " + std::to_string(longest) + " tokens, but " + model + " has a context of " +
                            std::to_string(context);
    if (w.context == ContextPolicy::reject) {
      throw Error(w.path + ": " + msg +
                  "; use a longer-context model (-m, e.g. `tessera synth --preset 110m --context 4096`) or set "
                  "'context: clamp' in the workload");
    }
    if (1 + system + std::max<int64_t>(1, c.prompt.min) >= context) {
      throw Error(w.path + ": " + msg + "; even its shortest prompt leaves no room to generate, so clamping cannot help");
    }
    clamped.push_back(msg);
  }
  return clamped;
}

}  // namespace tessera::bench
