// Renders a template with Jinja2 (tests/core/jinja/oracle_render.py under /usr/bin/python3), the
// oracle tessera's interpreter is compared with.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::test {

inline constexpr const char* kPython = "/usr/bin/python3";
inline constexpr long kFixedNow = 1721995200;  // 2024-07-26 12:00 UTC, strftime_now on both sides

struct OracleResult {
  bool ok = false;     // rendered
  std::string output;  // the rendered bytes
  std::string error;   // Jinja2's exception, when !ok
};

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::filesystem::path scratch(const std::string& leaf) {
  return std::filesystem::temp_directory_path() / ("tessera_jinja_" + std::to_string(getpid()) + "_" + leaf);
}

// Whether /usr/bin/python3 has jinja2; the oracle tests skip (saying so) when it does not.
inline bool jinja2_available() {
  static const bool ok = [] {
    const std::string cmd = std::string(kPython) + " -c 'import jinja2' >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }();
  return ok;
}

inline OracleResult jinja2_render_file(const std::filesystem::path& template_path, const nlohmann::ordered_json& context) {
  const auto ctx = scratch("ctx.json"), err = scratch("err.txt");
  {
    std::ofstream f(ctx, std::ios::binary);
    f << context.dump();
  }
  const std::string cmd = std::string(kPython) + " '" + TESSERA_SOURCE_DIR + "/tests/core/jinja/oracle_render.py' --template '" +
                          template_path.string() + "' --now " + std::to_string(kFixedNow) + " < '" + ctx.string() +
                          "' 2> '" + err.string() + "'";
  OracleResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    r.error = "popen failed";
    return r;
  }
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.ok = status == 0;
  if (!r.ok) r.error = read_text(err);
  std::filesystem::remove(ctx);
  std::filesystem::remove(err);
  return r;
}

inline OracleResult jinja2_render(const std::string& source, const nlohmann::ordered_json& context) {
  const auto path = scratch("template.jinja");
  {
    std::ofstream f(path, std::ios::binary);
    f << source;
  }
  OracleResult r = jinja2_render_file(path, context);
  std::filesystem::remove(path);
  return r;
}

}  // namespace tessera::test
