// tessera-conformance: the conformance suites of tests/conformance as an installed program, so a
// plugin or backend built out of tree is validated without editing the tree:
//
//   tessera-conformance --library /path/libtessera_my_scheduler.so [--kind scheduler] [gtest flags]
//
// It loads the installed plugins (the platform: the cpu backend that component suites run on) and
// the given libraries, then runs the suite of every kind those libraries register, for their
// plugins only. Without --library it runs every suite on every plugin it finds.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace {

using tessera::ComponentKind;

constexpr const char* kUsage =
    "usage: tessera-conformance [--library PATH]... [--kind KIND] [--gtest_* flags]\n"
    "  --library PATH  a plugin or backend library (libtessera_*.so) to test; repeatable. The suites\n"
    "                  run for the kinds and names it registers, on the installed plugins.\n"
    "  --kind KIND     only this kind's suite: backend, quantizer, attention, cache, scheduler, decoder\n"
    "  --list-plugins  print the plugins under test and exit\n"
    "Plugins are found in TESSERA_PLUGIN_PATH, beside libtessera_core and in the install prefix.\n"
    "Exit status: 0 when every selected test passed, 1 on a failure or a refused library.\n";

// gtest's --gtest_filter semantics: "POS1:POS2-NEG1:NEG2" with '*' and '?' wildcards.
bool glob(const char* p, const char* s) {
  if (*p == '\0') return *s == '\0';
  if (*p == '*') return glob(p + 1, s) || (*s != '\0' && glob(p, s + 1));
  return *s != '\0' && (*p == '?' || *p == *s) && glob(p + 1, s + 1);
}
bool any_glob(const std::string& patterns, const std::string& name) {
  size_t start = 0;
  while (start <= patterns.size()) {
    size_t end = patterns.find(':', start);
    if (end == std::string::npos) end = patterns.size();
    if (glob(patterns.substr(start, end - start).c_str(), name.c_str())) return true;
    start = end + 1;
  }
  return false;
}
bool filter_matches(const std::string& filter, const std::string& name) {
  const size_t dash = filter.find('-');
  const std::string pos = dash == std::string::npos ? filter : filter.substr(0, dash);
  const std::string neg = dash == std::string::npos ? "" : filter.substr(dash + 1);
  return any_glob(pos.empty() ? "*" : pos, name) && (neg.empty() || !any_glob(neg, name));
}

// Suites are named after the kind: "Schedulers/SchedulerConformance.Test/fcfs".
std::string suite_pattern(ComponentKind kind) {
  std::string k(tessera::kind_name(kind));
  k[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(k[0])));
  return "*/" + k + "Conformance.*";
}

constexpr ComponentKind kAllKinds[] = {ComponentKind::backend, ComponentKind::quantizer, ComponentKind::attention,
                                       ComponentKind::cache,   ComponentKind::scheduler, ComponentKind::decoder,
                                       ComponentKind::constraint, ComponentKind::comm};

}  // namespace

int main(int argc, char** argv) {
  tessera::conformance::Target target;
  std::string kind_text;
  bool list_only = false;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      const std::string eq = std::string(flag) + "=";
      if (a.rfind(eq, 0) == 0) return a.substr(eq.size());
      if (i + 1 >= argc) {
        std::cerr << "error: " << flag << " needs a value\n" << kUsage;
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--library" || a.rfind("--library=", 0) == 0) {
      target.libraries.push_back(value("--library"));
    } else if (a == "--kind" || a.rfind("--kind=", 0) == 0) {
      kind_text = value("--kind");
    } else if (a == "--list-plugins") {
      list_only = true;
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a.rfind("--gtest_", 0) == 0) {
      rest.push_back(argv[i]);
    } else {
      // A mistyped flag (--libary) must not run the installed suites and pass without testing the
      // library meant.
      std::cerr << "error: unknown argument '" << a << "'\n" << kUsage;
      return 1;
    }
  }
  std::vector<ComponentKind> kinds(std::begin(kAllKinds), std::end(kAllKinds));
  if (!kind_text.empty()) {
    ComponentKind k{};
    if (!tessera::parse_kind(kind_text, &k)) {
      std::cerr << "error: --kind '" << kind_text
                << "' is not a kind (backend, quantizer, attention, cache, scheduler, decoder, constraint)\n";
      return 1;
    }
    kinds = {k};
  }

  // Load everything before gtest instantiates the suites, so that a refused library is reported
  // as such (naming the file and the reason) instead of surfacing as an empty suite.
  tessera::conformance::set_target(target);
  try {
    tessera::conformance::registry();
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  for (const tessera::LoadFailure& f : tessera::conformance::registry().failures()) {
    std::cerr << "warning: not loaded: " << f.message << "\n";
  }
  std::vector<ComponentKind> tested;
  for (ComponentKind k : kinds) {
    const auto names = tessera::conformance::plugin_names(k);
    if (names.empty()) continue;
    tested.push_back(k);
    for (const auto& n : names) {
      const tessera::PluginEntry* e = tessera::conformance::registry().find(k, n);
      std::cout << "testing " << tessera::kind_name(k) << " '" << n << "' from " << e->library << "\n";
    }
  }
  if (tested.empty()) {
    std::cerr << "error: no plugin to test: "
              << (target.libraries.empty() ? "none found on the search path"
                                           : "the given libraries register no plugin")
              << (kind_text.empty() ? "" : " of kind " + kind_text) << " (searched "
              << tessera::conformance::plugin_source() << ")\n";
    return 1;
  }
  if (list_only) return 0;

  int gtest_argc = static_cast<int>(rest.size());
  rest.push_back(nullptr);  // argv[argc] is null: gtest moves it down as it removes its flags
  testing::InitGoogleTest(&gtest_argc, rest.data());

  // Narrow the user's --gtest_filter to the selected kinds. With libraries given, only the
  // parameterised suites run (the in-tree "*Plugins.*" checks are about the plugin directory).
  const bool narrow = !target.libraries.empty() || !kind_text.empty();
  if (narrow) {
    const std::string user_filter = GTEST_FLAG_GET(filter);
    std::string selected;
    const testing::UnitTest& ut = *testing::UnitTest::GetInstance();
    for (int s = 0; s < ut.total_test_suite_count(); ++s) {
      const testing::TestSuite& suite = *ut.GetTestSuite(s);
      for (int t = 0; t < suite.total_test_count(); ++t) {
        const std::string full = std::string(suite.name()) + "." + suite.GetTestInfo(t)->name();
        bool in_kind = false;
        for (ComponentKind k : tested) in_kind = in_kind || glob(suite_pattern(k).c_str(), full.c_str());
        if (in_kind && filter_matches(user_filter, full)) selected += (selected.empty() ? "" : ":") + full;
      }
    }
    if (selected.empty()) {
      std::cerr << "error: no test matches --gtest_filter=" << user_filter << " for the selected kinds\n";
      return 1;
    }
    GTEST_FLAG_SET(filter, selected);
  }
  std::cout << "tessera-conformance: plugin ABI " << TESSERA_ABI_VERSION << ", build identity '"
            << TESSERA_BUILD_ID << "'\n";
  return RUN_ALL_TESTS();
}
