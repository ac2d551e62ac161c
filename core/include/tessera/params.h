// Plugin parameters: each factory declares what it accepts (name, type, default, doc); the pipeline
// loader checks YAML against the declaration, so a plugin only ever sees validated, typed values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {

enum class ParamType : uint8_t {
  integer,
  number,       // floating point
  boolean,
  string,
  size,         // bytes; YAML may say 512MiB, 2GiB, 1000000
  string_list,  // [a, b, c]
  object,       // any structured YAML (lists of maps ...), passed on as JSON
};
std::string_view param_type_name(ParamType t);

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::string;
  nlohmann::json default_value;  // null = required
  std::string doc;
  std::vector<std::string> choices;  // for strings: allowed values (empty = any)
};

// Validated values: every declared parameter is present (given or defaulted).
class Params {
 public:
  Params() = default;
  explicit Params(nlohmann::json values) : values_(std::move(values)) {}

  bool has(std::string_view name) const;
  int64_t get_int(std::string_view name) const;
  double get_float(std::string_view name) const;
  bool get_bool(std::string_view name) const;
  std::string get_string(std::string_view name) const;
  std::vector<std::string> get_string_list(std::string_view name) const;
  const nlohmann::json& get(std::string_view name) const;  // throws Error if absent
  const nlohmann::json& json() const { return values_; }

 private:
  nlohmann::json values_ = nlohmann::json::object();
};

// Parses "512MiB", "1.5GiB", "64KB", "1000" into bytes; throws Error naming the text.
int64_t parse_size(std::string_view text);

// Fills defaults and checks types of `given` (a JSON object) against `specs`; throws Error naming the
// parameter, its expected type, the value and `where`.
Params validate_params(const std::vector<ParamSpec>& specs, const nlohmann::json& given,
                       const std::string& where);

}  // namespace tessera
