#include "tessera/params.h"

#include <cctype>
#include <cmath>
#include <string>

#include "tessera/error.h"

namespace tessera {

std::string_view param_type_name(ParamType t) {
  switch (t) {
    case ParamType::integer: return "integer";
    case ParamType::number: return "number";
    case ParamType::boolean: return "boolean";
    case ParamType::string: return "string";
    case ParamType::size: return "size (e.g. 512MiB)";
    case ParamType::string_list: return "list of strings";
    case ParamType::object: return "structured value";
  }
  return "?";
}

bool Params::has(std::string_view name) const {
  return values_.contains(std::string(name)) && !values_.at(std::string(name)).is_null();
}

const nlohmann::json& Params::get(std::string_view name) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) throw Error("parameter '" + std::string(name) + "' is not declared");
  return *it;
}

int64_t Params::get_int(std::string_view name) const { return get(name).get<int64_t>(); }
double Params::get_float(std::string_view name) const { return get(name).get<double>(); }
bool Params::get_bool(std::string_view name) const { return get(name).get<bool>(); }
std::string Params::get_string(std::string_view name) const { return get(name).get<std::string>(); }
std::vector<std::string> Params::get_string_list(std::string_view name) const {
  return get(name).get<std::vector<std::string>>();
}

int64_t parse_size(std::string_view text) {
  const std::string original(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw Error("'" + original + "' is not a size (expected e.g. 512MiB, 2GiB, 1048576)");
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(std::string(text.substr(0, i)), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != i) throw Error("'" + original + "' is not a size (expected e.g. 512MiB, 2GiB, 1048576)");
  std::string unit(text.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K") scale = 1024.0;
  else if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else throw Error("'" + original + "': unknown size unit '" + unit + "' (use B, KiB, MiB, GiB, KB, MB, GB)");
  if (value * scale >= 9.2e18) throw Error("'" + original + "' is too large a size");
  const auto bytes = static_cast<int64_t>(std::llround(value * scale));
  if (bytes == 0 && value > 0) throw Error("'" + original + "' rounds to 0 bytes");
  return bytes;
}

namespace {

// A value as JSON for a message. Bytes that are not UTF-8 (a YAML string may hold any) are replaced:
// the default dump throws nlohmann's type_error on them, which no caller expects (fuzz_pipeline).
std::string show(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

nlohmann::json coerce(const ParamSpec& spec, const nlohmann::json& v, const std::string& where) {
  auto fail = [&]() -> nlohmann::json {
    throw Error(where + ": parameter '" + spec.name + "' has the wrong type: expected " +
                std::string(param_type_name(spec.type)) + ", got " + show(v));
  };
  switch (spec.type) {
    case ParamType::integer:
      if (v.is_number_integer()) return v;
      if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
        // A whole number past int64 (YAML's 99999999999999999999 reads as a double) is out of range.
        if (std::fabs(v.get<double>()) >= 9.2e18) {
          throw Error(where + ": parameter '" + spec.name + "' is " + show(v) + ", outside the 64-bit integer range");
        }
        return int64_t(v.get<double>());
      }
      return fail();
    case ParamType::number:
      if (!v.is_number()) return fail();
      if (!std::isfinite(v.get<double>())) {  // YAML's nan or inf, read as a number
        throw Error(where + ": parameter '" + spec.name + "' is " + std::to_string(v.get<double>()) +
                    ": a finite number is expected");
      }
      return v.get<double>();
    case ParamType::boolean:
      if (v.is_boolean()) return v;
      return fail();
    case ParamType::string:
      if (!v.is_string()) return fail();
      if (!spec.choices.empty()) {
        for (const auto& c : spec.choices) {
          if (c == v.get<std::string>()) return v;
        }
        std::string list;
        for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
        throw Error(where + ": parameter '" + spec.name + "' is " + show(v) + "; expected one of: " + list);
      }
      return v;
    case ParamType::size:
      if (v.is_number_integer() && v.get<int64_t>() >= 0) return v;
      if (v.is_string()) {
        try {
          return parse_size(v.get<std::string>());
        } catch (const Error& e) {
          throw Error(where + ": parameter '" + spec.name + "': " + e.what());
        }
      }
      return fail();
    case ParamType::string_list:
      if (v.is_string()) return nlohmann::json::array({v});
      if (!v.is_array()) return fail();
      for (const auto& item : v) {
        if (!item.is_string()) return fail();
      }
      return v;
    case ParamType::object:
      return v;
  }
  return fail();
}

}  // namespace

Params validate_params(const std::vector<ParamSpec>& specs, const nlohmann::json& given,
                       const std::string& where) {
  nlohmann::json out = nlohmann::json::object();
  if (!given.is_null() && !given.is_object()) throw Error(where + ": parameters must be a map");
  if (given.is_object()) {
    for (const auto& [key, value] : given.items()) {
      const ParamSpec* spec = nullptr;
      for (const auto& s : specs) {
        if (s.name == key) spec = &s;
      }
      if (spec == nullptr) {
        std::string known;
        for (const auto& s : specs) known += (known.empty() ? "" : ", ") + s.name;
        throw Error(where + ": unknown parameter '" + key + "' (known: " +
                    (known.empty() ? std::string("none") : known) + ")");
      }
      out[key] = coerce(*spec, value, where);
    }
  }
  for (const auto& s : specs) {
    if (out.contains(s.name)) continue;
    if (s.default_value.is_null()) throw Error(where + ": missing required parameter '" + s.name + "'");
    out[s.name] = coerce(s, s.default_value, where + " (default)");
  }
  return Params(std::move(out));
}

}  // namespace tessera
