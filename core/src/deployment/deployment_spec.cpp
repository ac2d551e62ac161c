#include "tessera/deployment_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "tessera/error.h"
#include "tessera/read_file.h"
#include "../yaml/yaml_file.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// Relative paths: from the working directory when the file is there, else from the deployment's folder.
std::string beside(const std::string& deployment, const std::string& file) {
  const fs::path p = file;
  if (p.is_absolute() || fs::exists(p)) return file;
  const fs::path near = fs::path(deployment).parent_path() / p;
  return fs::exists(near) ? near.string() : file;
}

std::string scalar(const std::string& where, const YAML::Node& value, const std::string& what) {
  if (!value.IsScalar() || value.Scalar().empty()) throw Error(where + ": '" + what + "' must be a non-empty text");
  return value.Scalar();
}

std::string checked_name(const std::string& where, const YAML::Node& value, const std::string& what) {
  const std::string name = scalar(where, value, what);
  if (!valid_deployment_name(name)) {
    throw Error(where + ": " + what + " '" + name + "' must be 1 to 64 of the characters A-Z a-z 0-9 . _ : / -");
  }
  return name;
}

PipelineSpec load_pipeline_of(const std::string& path, const std::string& where, const YAML::Node& value) {
  const std::string file = beside(path, scalar(where, value, "pipeline"));
  try {
    return load_pipeline_spec(file);
  } catch (const Error& e) {
    throw Error(where + ": in pipeline: " + e.what());
  }
}

VariantSpec load_variant(const std::string& path, const YAML::Node& node, std::set<std::string>& names) {
  VariantSpec v;
  v.where = yaml_at(path, node);
  if (!node.IsMap()) throw Error(v.where + ": a variant must be a map (name, pipeline, weight)");
  bool has_pipeline = false;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string where = yaml_at_value(path, kv.first, kv.second);
    if (key == "name") {
      v.name = checked_name(where, kv.second, "variant name");
      if (!names.insert(v.name).second) throw Error(where + ": variant '" + v.name + "' is given twice in this model");
    } else if (key == "pipeline") {
      v.pipeline = load_pipeline_of(path, where, kv.second);
      has_pipeline = true;
    } else if (key == "weight") {
      const nlohmann::json w = yaml_to_json(kv.second);
      if (!w.is_number() || !std::isfinite(w.get<double>()) || w.get<double>() < 0) {
        throw Error(where + ": 'weight' is " + (kv.second.IsScalar() ? "'" + kv.second.Scalar() + "'" : "not a number") +
                    "; expected a number >= 0 (a share of the model's traffic)");
      }
      v.weight = w.get<double>();
    } else {
      throw Error(yaml_at(path, kv.first) + ": unknown key '" + key + "' (a variant has name, pipeline, weight)");
    }
  }
  if (v.name.empty()) throw Error(v.where + ": the variant needs 'name:'");
  if (!has_pipeline) throw Error(v.where + ": variant '" + v.name + "' needs 'pipeline:'");
  return v;
}

// Keys with the number each must be and its least value (exclusive where `above`).
struct RollbackKey {
  const char* name;
  double least;
  bool above;
  bool integer;
};
constexpr RollbackKey kRollbackKeys[] = {{"min_requests", 1, false, true},
                                         {"window", 0, true, false},
                                         {"max_error_rate", 0, false, false},
                                         {"max_ttft_p99_ratio", 0, false, false},
                                         {"max_tpot_p99_ratio", 0, false, false},
                                         {"max_perplexity_delta", 0, false, false}};

RollbackSpec load_rollback(const std::string& path, const std::string& where, const YAML::Node& node) {
  RollbackSpec r;
  r.enabled = true;
  r.where = where;
  if (!node.IsMap()) throw Error(where + ": 'rollback' must be a map (min_requests, window, max_error_rate, ...)");
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string at = yaml_at_value(path, kv.first, kv.second);
    if (key == "stable") {
      r.stable = scalar(at, kv.second, "stable");
      continue;
    }
    if (key == "eval_text") {
      r.eval_text = beside(path, scalar(at, kv.second, "eval_text"));
      if (!fs::is_regular_file(r.eval_text)) {
        throw Error(at + ": rollback: eval_text '" + kv.second.Scalar() + "' is not a file (looked in the working "
                    "directory and beside " + path + ")");
      }
      continue;
    }
    const RollbackKey* k = nullptr;
    for (const RollbackKey& c : kRollbackKeys) {
      if (key == c.name) k = &c;
    }
    if (k == nullptr) {
      throw Error(yaml_at(path, kv.first) + ": unknown key '" + key +
                  "' (rollback has stable, min_requests, window, max_error_rate, max_ttft_p99_ratio, "
                  "max_tpot_p99_ratio, max_perplexity_delta, eval_text)");
    }
    const nlohmann::json v = yaml_to_json(kv.second);
    const bool number = k->integer ? v.is_number_integer() : v.is_number();
    const double d = number ? v.get<double>() : 0;
    if (!number || !std::isfinite(d) || (k->above ? d <= k->least : d < k->least)) {
      throw Error(at + ": rollback: '" + key + "' is " + (kv.second.IsScalar() ? "'" + kv.second.Scalar() + "'" : "not a number") +
                  "; expected " + (k->integer ? "an integer" : "a number") + (k->above ? " > " : " >= ") +
                  std::to_string(int64_t(k->least)));
    }
    if (key == "min_requests") r.min_requests = v.get<int64_t>();
    if (key == "window") r.window = d;
    if (key == "max_error_rate") r.max_error_rate = d;
    if (key == "max_ttft_p99_ratio") r.max_ttft_p99_ratio = d;
    if (key == "max_tpot_p99_ratio") r.max_tpot_p99_ratio = d;
    if (key == "max_perplexity_delta") r.max_perplexity_delta = d;
  }
  if (r.max_perplexity_delta > 0 && r.eval_text.empty()) {
    throw Error(where + ": rollback: max_perplexity_delta needs eval_text: the text file every variant is scored on");
  }
  if (r.max_perplexity_delta == 0 && !r.eval_text.empty()) {
    throw Error(where + ": rollback: eval_text is read only for max_perplexity_delta (> 0), which is not set");
  }
  return r;
}

ModelSpec load_model(const std::string& path, const YAML::Node& node) {
  ModelSpec m;
  m.where = yaml_at(path, node);
  if (!node.IsMap()) throw Error(m.where + ": a model must be a map (name, and pipeline or variants)");
  std::string pipeline_where;  // non-empty once 'pipeline:' is read
  YAML::Node pipeline;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string where = yaml_at_value(path, kv.first, kv.second);
    if (key == "name") {
      m.name = checked_name(where, kv.second, "model name");
    } else if (key == "pipeline") {
      pipeline = kv.second;
      pipeline_where = where;
    } else if (key == "variants") {
      if (!kv.second.IsSequence() || kv.second.size() == 0) {
        throw Error(where + ": 'variants' must be a list of {name, pipeline, weight}");
      }
      std::set<std::string> names;
      for (const auto& item : kv.second) m.variants.push_back(load_variant(path, item, names));
    } else if (key == "rollback") {
      m.rollback = load_rollback(path, where, kv.second);
    } else {
      throw Error(yaml_at(path, kv.first) + ": unknown key '" + key +
                  "' (a model has name, pipeline, variants, rollback)");
    }
  }
  if (m.name.empty()) throw Error(m.where + ": the model needs 'name:'");
  if (!pipeline_where.empty() && !m.variants.empty()) {
    throw Error(pipeline_where + ": model '" + m.name + "' gives both 'pipeline' and 'variants'; give one");
  }
  if (!pipeline_where.empty()) {
    VariantSpec v;
    v.name = "default";
    v.pipeline = load_pipeline_of(path, pipeline_where, pipeline);
    v.where = pipeline_where;
    m.variants.push_back(std::move(v));
  } else if (m.variants.empty()) {
    throw Error(m.where + ": model '" + m.name + "' needs 'pipeline:' or 'variants:'");
  }
  if (m.rollback.enabled) {
    if (m.variants.size() < 2) {
      throw Error(m.rollback.where + ": model '" + m.name + "' has one variant: 'rollback' guards canaries beside a stable one");
    }
    if (m.rollback.stable.empty()) m.rollback.stable = m.variants.front().name;
    const bool found = std::any_of(m.variants.begin(), m.variants.end(),
                                   [&](const VariantSpec& v) { return v.name == m.rollback.stable; });
    if (!found) {
      throw Error(m.rollback.where + ": rollback: stable variant '" + m.rollback.stable + "' is not a variant of model '" +
                  m.name + "'");
    }
  }
  double total = 0;
  for (const VariantSpec& v : m.variants) total += v.weight;
  if (!(total > 0)) throw Error(m.where + ": the weights of model '" + m.name + "' add up to 0: no variant would get traffic");
  return m;
}

}  // namespace

bool valid_deployment_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

DeploymentSpec load_deployment_spec(const std::string& path) {
  const YAML::Node root = load_yaml(path, read_file(path, "deployment file"), "a deployment");
  if (!root.IsMap()) throw Error(path + ": a deployment must be a YAML map (models, server)");
  DeploymentSpec spec;
  spec.path = path;
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const std::string where = yaml_at_value(path, kv.first, kv.second);
      if (key == "models") {
        if (!kv.second.IsSequence() || kv.second.size() == 0) {
          throw Error(where + ": 'models' must be a list of {name, pipeline} or {name, variants}");
        }
        std::set<std::string> names;
        for (const auto& item : kv.second) {
          ModelSpec m = load_model(path, item);
          if (!names.insert(m.name).second) throw Error(m.where + ": model '" + m.name + "' is given twice");
          spec.models.push_back(std::move(m));
        }
      } else if (key == "server") {
        load_server_section(path, where, kv.second, spec.server, spec.server_where);
      } else {
        throw Error(yaml_at(path, kv.first) + ": unknown key '" + key + "' (a deployment has models, server)");
      }
    }
  } catch (const YAML::Exception& e) {  // a list or map where a name belongs
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": expected a plain value here, not a list or map (" +
                e.msg + ")");
  }
  if (spec.models.empty()) throw Error(path + ": the deployment needs 'models:'");
  return spec;
}

DeploymentSpec single_pipeline_deployment(PipelineSpec pipeline, const std::string& name) {
  DeploymentSpec spec;
  spec.path = pipeline.path;
  spec.server = pipeline.server;
  spec.server_where = pipeline.server_where;
  const std::string where = pipeline.path.empty() ? "(defaults)" : pipeline.path;
  VariantSpec v;
  v.name = "default";
  v.pipeline = std::move(pipeline);
  v.where = where;
  ModelSpec m;
  m.name = name;
  m.variants.push_back(std::move(v));
  m.where = where;
  spec.models.push_back(std::move(m));
  return spec;
}

}  // namespace tessera
