// The report as one self-contained HTML file: inline CSS and SVG charts (latency CDFs, throughput
// and memory bars, TTFT against load), no external assets. A few lines of inline script only check
// that the browser drew every chart (data-charts-drawn on <body>, read by the headless test).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "tessera/bench/report.h"

namespace tessera::bench {

namespace {

using nlohmann::json;

const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"};
constexpr double kW = 640, kH = 300, kLeft = 64, kRight = 16, kTop = 34, kBottom = 44;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}
std::string str(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
std::string num(double v, int digits = 1) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}
std::string numj(const json& v, int digits = 1) { return v.is_number() ? num(v.get<double>(), digits) : "n/a"; }

// 0 .. a round number above `hi`, in about 5 steps.
std::vector<double> ticks(double hi) {
  if (!(hi > 0)) hi = 1;
  const double raw = hi / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> t;
  for (double v = 0; v < hi + step * 0.999; v += step) t.push_back(v);
  return t;
}
std::string tick_label(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 100) return num(v, 0);
  if (std::fabs(v) >= 1) return num(v, std::fmod(v, 1.0) == 0 ? 0 : 1);
  return num(v, 3);
}

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

std::string svg_open(const std::string& title) {
  std::ostringstream s;
  s << "<svg class=\"chart\" viewBox=\"0 0 " << kW << " " << kH
    << "\" width=\"" << kW << "\" height=\"" << kH << "\" role=\"img\" aria-label=\"" << esc(title) << "\">"
    << "<text x=\"" << kW / 2 << "\" y=\"18\" text-anchor=\"middle\" class=\"title\">" << esc(title) << "</text>";
  return s.str();
}

std::string axes(const std::vector<double>& xt, double xmax, const std::vector<double>& yt, double ymax,
                 const std::string& xlabel, const std::string& ylabel) {
  std::ostringstream s;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  for (double y : yt) {
    const double py = kTop + ph - y / ymax * ph;
    s << "<line x1=\"" << kLeft << "\" y1=\"" << py << "\" x2=\"" << kW - kRight << "\" y2=\"" << py
      << "\" class=\"grid\"/><text x=\"" << kLeft - 6 << "\" y=\"" << py + 4 << "\" text-anchor=\"end\">"
      << tick_label(y) << "</text>";
  }
  for (double x : xt) {
    const double px = kLeft + x / xmax * pw;
    s << "<text x=\"" << px << "\" y=\"" << kTop + ph + 16 << "\" text-anchor=\"middle\">" << tick_label(x) << "</text>";
  }
  s << "<line x1=\"" << kLeft << "\" y1=\"" << kTop + ph << "\" x2=\"" << kW - kRight << "\" y2=\"" << kTop + ph
    << "\" class=\"axis\"/><line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\"" << kTop + ph
    << "\" class=\"axis\"/>";
  s << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kH - 6 << "\" text-anchor=\"middle\">" << esc(xlabel) << "</text>";
  s << "<text transform=\"translate(14," << kTop + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << esc(ylabel)
    << "</text>";
  return s.str();
}

std::string legend(const std::vector<std::string>& names) {
  std::ostringstream s;
  s << "<div class=\"legend\">";
  for (size_t i = 0; i < names.size(); ++i) {
    s << "<span><i style=\"background:" << kColors[i % 8] << "\"></i>" << esc(names[i]) << "</span>";
  }
  s << "</div>";
  return s.str();
}

// Lines (steps for CDFs) per series on shared axes from 0.
std::string line_chart(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                       const std::vector<Series>& series, bool step, double fixed_ymax = 0) {
  double xmax = 0, ymax = fixed_ymax;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      xmax = std::max(xmax, x);
      if (fixed_ymax == 0) ymax = std::max(ymax, y);
    }
  }
  const std::vector<double> xt = ticks(xmax), yt = fixed_ymax > 0 ? std::vector<double>{0, 0.25, 0.5, 0.75, 1.0}
                                                                   : ticks(ymax);
  xmax = xt.back();
  ymax = yt.back();
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  std::ostringstream s;
  s << svg_open(title) << axes(xt, xmax, yt, ymax, xlabel, ylabel);
  bool any = false;
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i].points.empty()) continue;
    any = true;
    s << "<polyline class=\"data\" fill=\"none\" stroke-width=\"2\" stroke=\"" << kColors[i % 8] << "\" points=\"";
    double prev_y = kTop + ph;
    bool first = true;
    for (const auto& [x, y] : series[i].points) {
      const double px = kLeft + x / xmax * pw, py = kTop + ph - y / ymax * ph;
      if (step && !first) s << px << "," << prev_y << " ";
      if (step && first) s << px << "," << kTop + ph << " ";
      s << px << "," << py << " ";
      prev_y = py;
      first = false;
    }
    s << "\"><title>" << esc(series[i].name) << "</title></polyline>";
    if (series[i].points.size() == 1) {
      const auto [x, y] = series[i].points.front();
      s << "<circle class=\"data\" r=\"3\" fill=\"" << kColors[i % 8] << "\" cx=\"" << kLeft + x / xmax * pw
        << "\" cy=\"" << kTop + ph - y / ymax * ph << "\"/>";
    }
  }
  if (!any) s << "<text x=\"" << kW / 2 << "\" y=\"" << kH / 2 << "\" text-anchor=\"middle\">no data</text>";
  s << "</svg>";
  return s.str();
}

// Grouped bars: one group per metric, one bar per pipeline.
std::string bar_chart(const std::string& title, const std::string& ylabel, const std::vector<std::string>& groups,
                      const std::vector<std::string>& names, const std::vector<std::vector<double>>& values) {
  double ymax = 0;
  for (const auto& g : values) {
    for (double v : g) ymax = std::max(ymax, v);
  }
  const std::vector<double> yt = ticks(ymax);
  ymax = yt.back();
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  std::ostringstream s;
  s << svg_open(title) << axes({}, 1, yt, ymax, "", ylabel);
  const double group_w = pw / double(std::max<size_t>(1, groups.size()));
  const double bar_w = group_w * 0.8 / double(std::max<size_t>(1, names.size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    const double gx = kLeft + group_w * double(g) + group_w * 0.1;
    for (size_t i = 0; i < names.size(); ++i) {
      const double v = values[g][i];
      const double h = ymax > 0 ? v / ymax * ph : 0;
      s << "<rect class=\"data\" x=\"" << gx + bar_w * double(i) << "\" y=\"" << kTop + ph - h << "\" width=\""
        << bar_w * 0.9 << "\" height=\"" << std::max(h, 0.5) << "\" fill=\"" << kColors[i % 8] << "\"><title>"
        << esc(names[i]) << ": " << tick_label(v) << "</title></rect>";
    }
    s << "<text x=\"" << kLeft + group_w * (double(g) + 0.5) << "\" y=\"" << kTop + ph + 16
      << "\" text-anchor=\"middle\">" << esc(groups[g]) << "</text>";
  }
  s << "</svg>";
  return s.str();
}

double value(const json& v) { return v.is_number() ? v.get<double>() : 0.0; }
// Bytes as MiB; "n/a" where the column cannot measure it (servers over HTTP).
std::string mib_or_na(const json& v, int digits) { return v.is_number() ? num(v.get<double>() / 1048576.0, digits) : "n/a"; }

}  // namespace

std::string render_html(const json& r) {
  std::vector<const json*> ok;
  std::vector<std::string> names;
  for (const auto& p : r["pipelines"]) {
    if (p["status"] == "ok") {
      ok.push_back(&p);
      names.push_back(str(p["name"]));
    }
  }
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tessera bench: "
    << esc(str(r["workload"]["name"])) << "</title>\n<style>\n"
    << "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}"
       "h1{font-size:22px}h2{font-size:18px;margin-top:28px}"
       "table{border-collapse:collapse;font-size:13px;margin:8px 0}"
       "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}td:first-child,th:first-child{text-align:left}"
       "th{background:#f3f3f3}.charts{display:flex;flex-wrap:wrap;gap:12px}"
       "svg.chart{background:#fff;border:1px solid #ddd}svg text{font-size:11px;fill:#333}"
       "svg text.title{font-size:13px;font-weight:600}.grid{stroke:#eee}.axis{stroke:#888}"
       ".legend span{margin-right:14px;font-size:13px}.legend i{display:inline-block;width:12px;height:12px;"
       "margin-right:4px;vertical-align:middle}.fail{color:#b00}code,pre{background:#f6f6f6;padding:2px 4px}"
       "pre{padding:8px;white-space:pre-wrap}\n</style></head><body>\n";
  h << "<h1>tessera bench: " << esc(str(r["workload"]["name"])) << "</h1>\n";
  const std::string ref = r["reference"].is_string() ? r["reference"].get<std::string>() : "none";
  h << "<p>Reference: <b>" << esc(ref) << "</b>";
  if (r.contains("reference_note")) h << " (" << esc(str(r["reference_note"])) << ")";
  h << ". One run each on the identical trace.</p>\n";

  const json& q = r["five_questions"];
  h << "<h2>Five questions</h2><ol>";
  h << "<li><b>What got faster?</b><ul>";
  for (const auto& l : q["what_got_faster"]) h << "<li>" << esc(str(l)) << "</li>";
  h << "</ul></li><li><b>Under which conditions?</b> " << esc(str(q["under_which_conditions"])) << "</li>";
  h << "<li><b>For which request classes?</b><ul>";
  for (const auto& l : q["for_which_request_classes"]) h << "<li>" << esc(str(l)) << "</li>";
  h << "</ul></li><li><b>At what cost?</b><ul>";
  for (const auto& l : q["at_what_cost"]) h << "<li>" << esc(str(l)) << "</li>";
  h << "</ul></li><li><b>Reproduce:</b><pre>" << esc(str(q["reproduce"])) << "</pre></li></ol>\n";

  h << "<h2>Charts</h2>" << legend(names) << "<div class=\"charts\">\n";
  for (const auto& [key, label] : {std::pair{"ttft", "TTFT"}, {"tpot", "TPOT"}, {"e2e", "End-to-end latency"}}) {
    std::vector<Series> series;
    for (const json* p : ok) {
      Series s{str((*p)["name"]), {}};
      for (const auto& pt : (*p)["cdf_ms"][key]) s.points.emplace_back(pt[0].get<double>(), pt[1].get<double>());
      series.push_back(std::move(s));
    }
    h << line_chart(std::string(label) + " CDF", std::string(label) + " (ms)", "share of requests", series, true, 1.0)
      << "\n";
  }
  {
    std::vector<std::vector<double>> tput(1), reqs(1), mem(3);
    for (const json* p : ok) {
      tput[0].push_back(value((*p)["throughput"]["output_tokens_per_s"]));
      reqs[0].push_back(value((*p)["throughput"]["requests_per_s"]));
      mem[0].push_back(value((*p)["memory"]["peak_rss_bytes"]) / 1048576.0);
      mem[1].push_back(value((*p)["memory"]["kv_bytes_total"]) / 1048576.0);
      mem[2].push_back(value((*p)["memory"]["kv_bytes_peak"]) / 1048576.0);
    }
    h << bar_chart("Output throughput", "tokens/s", {"output tokens/s"}, names, tput) << "\n";
    h << bar_chart("Request throughput", "requests/s", {"requests/s"}, names, reqs) << "\n";
    h << bar_chart("Memory", "MiB", {"peak RSS", "KV pool", "KV peak in use"}, names, mem) << "\n";
    std::vector<Series> load;
    for (const json* p : ok) {
      Series s{str((*p)["name"]), {}};
      for (const auto& b : (*p)["ttft_by_load"]) {
        s.points.emplace_back((value(b["in_flight_min"]) + value(b["in_flight_max"])) / 2, value(b["ttft_mean_ms"]));
      }
      load.push_back(std::move(s));
    }
    h << line_chart("TTFT against load", "requests in flight on arrival", "mean TTFT (ms)", load, false) << "\n";
  }
  h << "</div>\n";

  h << "<h2>Results</h2><table><tr><th>pipeline</th><th>output tok/s</th><th>req/s</th><th>TTFT P50/P95/P99 ms</th>"
       "<th>TPOT P50/P95/P99 ms</th><th>E2E P50/P95/P99 ms</th><th>peak RSS MiB</th><th>KV pool / peak MiB</th>"
       "<th>prefix hit</th><th>draft accept</th><th>ppl delta %</th><th>greedy agree</th><th>x tok/s</th>"
       "<th>x TTFT P95</th><th>x E2E P50</th></tr>\n";
  auto three = [](const json& s) { return numj(s["p50"]) + " / " + numj(s["p95"]) + " / " + numj(s["p99"]); };
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") {
      h << "<tr><td>" << esc(str(p["name"])) << "</td><td colspan=\"14\" class=\"fail\">failed (" << esc(str(p["failed_stage"]))
        << "): " << esc(str(p["error"])) << "</td></tr>\n";
      continue;
    }
    const json& l = p["latency_ms"];
    const json& a = p["accuracy"];
    h << "<tr><td>" << esc(str(p["name"])) << "</td><td>" << numj(p["throughput"]["output_tokens_per_s"], 0) << "</td><td>"
      << numj(p["throughput"]["requests_per_s"], 2) << "</td><td>" << three(l["ttft"]) << "</td><td>" << three(l["tpot"])
      << "</td><td>" << three(l["e2e"]) << "</td><td>" << mib_or_na(p["memory"]["peak_rss_bytes"], 1)
      << "</td><td>" << mib_or_na(p["memory"]["kv_bytes_total"], 2) << " / "
      << mib_or_na(p["memory"]["kv_bytes_peak"], 2) << "</td><td>"
      << (p["prefix"]["hit_rate"].is_number() ? num(value(p["prefix"]["hit_rate"]) * 100, 1) + "%" : "n/a") << "</td><td>"
      << (p["draft"]["acceptance"].is_number() ? num(value(p["draft"]["acceptance"]) * 100, 1) + "%" : "n/a")
      << "</td><td>" << numj(a.value("perplexity_delta_percent", json()), 2) << "</td><td>"
      << numj(a.value("greedy_agreement", json()), 3) << "</td><td>" << numj(p["ratios"]["output_tokens_per_s"], 2)
      << "</td><td>" << numj(p["ratios"]["ttft_p95"], 2) << "</td><td>" << numj(p["ratios"]["e2e_p50"], 2)
      << "</td></tr>\n";
  }
  h << "</table>\n<h2>Per request class</h2><table><tr><th>pipeline</th><th>class</th><th>requests</th>"
       "<th>TTFT P50/P95/P99 ms</th><th>TPOT P50/P95/P99 ms</th><th>E2E P50/P95/P99 ms</th><th>cached prompt</th></tr>\n";
  for (const json* p : ok) {
    for (const auto& [name, c] : (*p)["classes"].items()) {
      h << "<tr><td>" << esc(str((*p)["name"])) << "</td><td>" << esc(name) << "</td><td>" << c["count"] << "</td><td>"
        << three(c["latency_ms"]["ttft"]) << "</td><td>" << three(c["latency_ms"]["tpot"]) << "</td><td>"
        << three(c["latency_ms"]["e2e"]) << "</td><td>"
        << (c["cached_prompt_share"].is_number() ? num(value(c["cached_prompt_share"]) * 100, 1) + "%" : "n/a")
        << "</td></tr>\n";
    }
  }
  h << "</table>\n<h2>Per user</h2><table><tr><th>pipeline</th><th>user</th><th>requests</th><th>TTFT P50/P95/P99 ms</th>"
       "<th>E2E P50/P95/P99 ms</th><th>cached prompt</th><th>cache hit rate</th></tr>\n";
  for (const json* p : ok) {
    for (const auto& [name, u] : (*p)["users"].items()) {
      h << "<tr><td>" << esc(str((*p)["name"])) << "</td><td>" << esc(name) << "</td><td>" << u["count"] << "</td><td>"
        << three(u["latency_ms"]["ttft"]) << "</td><td>" << three(u["latency_ms"]["e2e"]) << "</td><td>"
        << (u["cached_prompt_share"].is_number() ? num(value(u["cached_prompt_share"]) * 100, 1) + "%" : "n/a")
        << "</td><td>" << (u["prefix_hit_rate"].is_number() ? num(value(u["prefix_hit_rate"]) * 100, 1) + "%" : "n/a")
        << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  bool any_variant = false;
  for (const json* p : ok) any_variant = any_variant || (p->contains("variants") && !(*p)["variants"].empty());
  if (any_variant) {
    h << "<h2>Per variant (the server's X-Tessera-Variant header)</h2><table><tr><th>server</th><th>variant</th>"
         "<th>requests</th><th>errors</th><th>output tok/s</th><th>TTFT P50/P95/P99 ms</th><th>TPOT P50/P95/P99 ms</th>"
         "<th>E2E P50/P95/P99 ms</th></tr>\n";
    for (const json* p : ok) {
      if (!p->contains("variants")) continue;
      for (const auto& [name, v] : (*p)["variants"].items()) {
        h << "<tr><td>" << esc(str((*p)["name"])) << "</td><td>" << esc(name) << "</td><td>" << v["count"] << "</td><td>"
          << v["errors"] << "</td><td>" << numj(v["output_tokens_per_s"], 1) << "</td><td>"
          << three(v["latency_ms"]["ttft"]) << "</td><td>" << three(v["latency_ms"]["tpot"]) << "</td><td>"
          << three(v["latency_ms"]["e2e"]) << "</td></tr>\n";
      }
    }
    h << "</table>\n";
  }

  const json& c = r["conditions"];
  h << "<h2>Conditions</h2><table>";
  auto kv = [&h](const std::string& k, const std::string& v) {
    h << "<tr><th>" << esc(k) << "</th><td style=\"text-align:left\">" << esc(v) << "</td></tr>";
  };
  auto get = [](const json& j, const char* a, const char* b = nullptr) -> std::string {
    if (!j.contains(a)) return "n/a";
    if (b == nullptr) return str(j[a]);
    return j[a].contains(b) ? str(j[a][b]) : "n/a";
  };
  kv("CPU", get(c, "cpu", "model") + ", " + get(c, "cpu", "cores") + " cores (" + get(c, "cpu", "usable_cores") + " usable)");
  kv("threads", get(c, "threads"));
  kv("memory", num(c.value("memory_bytes", 0.0) / 1073741824.0, 1) + " GiB");
  kv("read bandwidth", numj(c["machine"]["read_bandwidth_gbs"], 2) + " GB/s (" + get(c["machine"], "read_bandwidth_method") + ")");
  kv("FMA peak", numj(c["machine"]["fma_peak_gflops"], 1) + " GFLOP/s (" + get(c["machine"], "fma_peak_method") + ")");
  if (c["machine"].contains("core_round_trip_ns")) {
    kv("core-to-core round trip",
       numj(c["machine"]["core_round_trip_ns"], 0) + " ns (" + get(c["machine"], "core_round_trip_method") + ")");
  }
  kv("backend", get(c, "backend"));
  kv("model", get(c, "model", "path") + " (" + get(c, "model", "name") + ", " + get(c, "model", "weights") + ", context " +
                  get(c, "model", "context") + ")");
  kv("load", get(c, "load"));
  kv("build", get(c, "build_type") + ", commit " + get(c, "git_commit") + ", " + get(c, "compiler"));
  kv("date", get(c, "date"));
  kv("command", get(c, "command"));
  const json& w = r["workload"];
  kv("workload", str(w["name"]) + " (" + str(w["file"]) + "), " + str(w["requests"]) + " requests, seed " + str(w["seed"]) +
                     ", trace " + str(w["trace"]["fingerprint"]));
  for (const auto& cl : w["classes"]) {
    kv("class " + str(cl["name"]), "weight " + str(cl["weight"]) + ", prompt " + str(cl["prompt"]) + ", output " +
                                      str(cl["output"]) + ", " + str(cl["requests"]) + " requests");
  }
  h << "</table>\n";
  // Self-check for headless tests: every chart's data marks must have a non-empty box.
  h << "<script>\n(function(){var charts=document.querySelectorAll('svg.chart'),drawn=0;"
       "charts.forEach(function(svg){var ok=false;svg.querySelectorAll('.data').forEach(function(e){var b=e.getBBox();"
       "if(b.width>0||b.height>0)ok=true;});if(ok)drawn++;});"
       "document.body.setAttribute('data-charts-total',charts.length);"
       "document.body.setAttribute('data-charts-drawn',drawn);})();\n</script>\n";
  h << "</body></html>\n";
  return h.str();
}

}  // namespace tessera::bench
