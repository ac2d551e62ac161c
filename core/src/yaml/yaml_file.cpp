#include "yaml_file.h"

#include <yaml-cpp/depthguard.h>  // YAML::DeepRecursion
#include <yaml-cpp/eventhandler.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <vector>

#include "tessera/error.h"
#include "tessera/params.h"
#include "tessera/pipeline_spec.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// yaml-cpp keeps the last of two equal keys in a map; a file must not say one thing twice.
// A walk visits an alias at every use, so ten lines of aliases that repeat aliases stand for 10^10
// values (a "billion laughs"): past `budget` values the file is refused, before anything walks it.
void check_duplicate_keys(const std::string& file, const YAML::Node& node, const std::string& what, int64_t& budget) {
  if (--budget < 0) {
    throw Error(file + ": the YAML expands to more than 100000 values (aliases that repeat aliases?); " + what +
                       " is a few dozen keys");
  }
  if (node.IsSequence()) {
    for (const auto& item : node) check_duplicate_keys(file, item, what, budget);
  } else if (node.IsMap()) {
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
      if (!seen.insert(key).second) throw Error(yaml_at(file, kv.first) + ": duplicate key '" + key + "'");
      check_duplicate_keys(file, kv.first, what, budget);
      check_duplicate_keys(file, kv.second, what, budget);
    }
  }
}

// Counts the file's YAML documents without building them. Not YAML::LoadAll: yaml-cpp 0.7 never
// ends on a flow indicator outside brackets (a line starting with ','): it yields empty documents at
// the same place for ever. A document starting where the previous one did is that case.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

void check_one_document(const std::string& path, const std::string& text, const std::string& what) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts docs;
  while (parser.HandleNextDocument(docs)) {
    const size_t n = docs.starts.size();
    if (n < 2 || docs.starts[n - 1].pos != docs.starts[n - 2].pos) continue;
    const YAML::Mark& stuck = docs.starts[n - 1];
    std::string line = text.substr(static_cast<size_t>(stuck.pos));
    line = line.substr(0, std::min(line.find('\n'), size_t{40}));
    throw Error(path + ":" + std::to_string(stuck.line + 1) + ": invalid YAML: unexpected '" + line.substr(0, 1) + "' in \"" + line +
                "\" (',', '[', ']', '{' and '}' belong inside a [list] or {map}; quote a value that starts with one)");
  }
  if (docs.starts.size() > 1) {
    throw Error(path + ": holds " + std::to_string(docs.starts.size()) +
                " YAML documents (separated by '---'); " + what + " is one document");
  }
}

}  // namespace

std::string yaml_at(const std::string& file, const YAML::Node& node) {
  return file + ":" + std::to_string(node.Mark().line + 1);
}

std::string yaml_at_value(const std::string& file, const YAML::Node& key, const YAML::Node& value) {
  return yaml_at(file, value.IsNull() ? key : value);
}

nlohmann::json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Scalar: {
      const std::string s = node.Scalar();
      if (node.Tag() == "!") return s;
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      if (s == "~" || s == "null") return nullptr;
      try {
        size_t used = 0;
        const long long i = std::stoll(s, &used);
        if (used == s.size()) return static_cast<int64_t>(i);
      } catch (const std::exception&) {
      }
      try {
        size_t used = 0;
        const double d = std::stod(s, &used);
        // inf and nan stay text: JSON has no such numbers (they would read back as null).
        if (used == s.size() && std::isfinite(d)) return d;
      } catch (const std::exception&) {
      }
      return s;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& item : node) arr.push_back(yaml_to_json(item));
      return arr;
    }
    case YAML::NodeType::Map: {
      nlohmann::json obj = nlohmann::json::object();
      for (const auto& kv : node) obj[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return obj;
    }
  }
  return nullptr;
}

YAML::Node load_yaml(const std::string& path, const std::string& text, const std::string& what) {
  YAML::Node root;
  try {
    check_one_document(path, text, what);
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own message for it is "bad file"
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": YAML nested too deeply (lists or maps inside each other); " +
                what + " is a few levels deep");
  } catch (const YAML::Exception& e) {
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  int64_t budget = 100000;
  check_duplicate_keys(path, root, what, budget);
  return root;
}

void load_server_section(const std::string& path, const std::string& where, const YAML::Node& value,
                         nlohmann::json& server, std::map<std::string, std::string>& server_where) {
  if (!value.IsMap()) throw Error(where + ": 'server' must be a map (host, port, api_key_file, ...)");
  for (const auto& kv : value) {
    const std::string key = kv.first.as<std::string>();
    const std::string where = yaml_at(path, kv.first);
    const Params p = validate_params(server_params(), nlohmann::json{{key, yaml_to_json(kv.second)}}, where + ": server");
    nlohmann::json v = p.get(key);
    check_server_value(key, v, where);
    if (key == "api_key_file") {
      // Relative to the working directory, else to the file's folder.
      fs::path file = v.get<std::string>();
      const fs::path beside = fs::path(path).parent_path() / file;
      if (file.is_relative() && !fs::exists(file) && fs::exists(beside)) v = beside.string();
    }
    // A key given here replaces its alternative from an extended file.
    const char* other = key == "api_key" ? "api_key_file" : key == "api_key_file" ? "api_key" : nullptr;
    if (other != nullptr && value[other]) {
      throw Error(where + ": server: give api_key or api_key_file, not both");
    }
    if (other != nullptr) {
      server.erase(other);
      server_where.erase(other);
    }
    server[key] = v;
    server_where[key] = where;
  }
}

}  // namespace tessera
