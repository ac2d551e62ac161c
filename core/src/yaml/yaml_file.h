// Reading the project's YAML files (pipelines, deployments) with yaml-cpp: one document, no duplicate
// keys, bounded expansion, and every message naming file:line. Internal to the core.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

// "file:line" of a node.
std::string yaml_at(const std::string& file, const YAML::Node& node);
// Where a map entry's value is: an empty value (`kv_dtype:`) has no text of its own, and yaml-cpp
// marks it where the next token starts (the next line): the key's line then.
std::string yaml_at_value(const std::string& file, const YAML::Node& key, const YAML::Node& value);
// A node as JSON: a quoted scalar is a string, a bare one a bool, integer or number when it looks
// like one (inf and nan stay text).
nlohmann::json yaml_to_json(const YAML::Node& node);
// Parses `text` (read from `path`) as one YAML document of `what` ("a pipeline"): throws Error with
// file:line for invalid YAML, several documents, deep nesting, duplicate keys or alias bombs.
YAML::Node load_yaml(const std::string& path, const std::string& text, const std::string& what);
// Reads a `server:` map into `server` (checked against server_params(), key by key so that each
// error names its line) and `server_where`; `where` is the section's own place.
void load_server_section(const std::string& path, const std::string& where, const YAML::Node& value,
                         nlohmann::json& server, std::map<std::string, std::string>& server_where);

}  // namespace tessera
