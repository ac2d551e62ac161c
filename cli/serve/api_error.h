// An OpenAI-style API error: the HTTP status and the JSON body clients parse
// ({"error": {"message", "type", "param", "code"}}), naming the request field at fault.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "")
      : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)),
        type_(type.empty() ? default_type(status) : std::move(type)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }

  nlohmann::json body() const {
    nlohmann::json e = {{"message", what()}, {"type", type_}, {"param", nullptr}, {"code", nullptr}};
    if (!param_.empty()) e["param"] = param_;
    if (!code_.empty()) e["code"] = code_;
    return {{"error", e}};
  }

 private:
  static std::string default_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
  }
  int status_;
  std::string param_, code_, type_;
};

// Shorthand for the common case: a 400 naming the field.
inline ApiError bad_field(const std::string& param, const std::string& message,
                          const std::string& code = "invalid_value") {
  return ApiError(400, message, param, code);
}

}  // namespace tessera::serve
