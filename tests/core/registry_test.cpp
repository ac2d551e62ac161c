// The plugin loader through real shared libraries: refusals name the file and the reason, refused
// libraries leave nothing behind, and created objects keep their library loaded.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "test_util.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

const std::string kLibs = TESSERA_TEST_LIB_DIR;

std::string load_error(Registry& r, const std::string& file) {
  try {
    r.load_library(kLibs + "/" + file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, LoadsEveryShippedPluginFromTheBuildTree) {
  const Registry& r = test::plugins();
  EXPECT_TRUE(r.failures().empty()) << r.failures().front().message;
  for (auto [kind, name] : std::vector<std::pair<ComponentKind, std::string>>{
           {ComponentKind::backend, "cpu"},       {ComponentKind::quantizer, "none"},
           {ComponentKind::attention, "gqa"},     {ComponentKind::cache, "contiguous"},
           {ComponentKind::scheduler, "fcfs"},    {ComponentKind::decoder, "sampling"}}) {
    const PluginEntry* e = r.find(kind, name);
    ASSERT_NE(e, nullptr) << kind_name(kind) << " " << name;
    EXPECT_NE(e->library.find("libtessera_"), std::string::npos);
  }
}

TEST(Registry, RefusesAnAbiMismatchNamingTheFile) {
  Registry r;
  const std::string msg = load_error(r, "libtestlib_bad_abi.so");
  EXPECT_NE(msg.find("libtestlib_bad_abi.so"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ABI version " + std::to_string(TESSERA_ABI_VERSION + 1)), std::string::npos) << msg;
  EXPECT_TRUE(r.all_entries().empty());
  // Refused, it is not kept loaded (accepted libraries are, for good).
  void* still = dlopen((kLibs + "/libtestlib_bad_abi.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_EQ(still, nullptr) << "a refused library stayed mapped";
  if (still != nullptr) dlclose(still);
}

TEST(Registry, RefusesAForeignBuildIdentity) {
  Registry r;
  const std::string msg = load_error(r, "libtestlib_bad_build.so");
  EXPECT_NE(msg.find("libtestlib_bad_build.so"), std::string::npos) << msg;
  EXPECT_NE(msg.find("build identity"), std::string::npos) << msg;
}

TEST(Registry, RefusesALibraryWithoutTheEntryPoint) {
  Registry r;
  const std::string msg = load_error(r, "libtestlib_no_entry.so");
  EXPECT_NE(msg.find("not a Tessera plugin"), std::string::npos) << msg;
  EXPECT_NE(load_error(r, "libtestlib_missing.so").find("not found"), std::string::npos);
}

TEST(Registry, AMissingDependencyIsNamedAsTheLoaderNamesIt) {
  // Boost.DLL's error code alone said "Bad file descriptor".
  Registry r;
  const std::string msg = load_error(r, "libtestlib_missing_dep.so");
  EXPECT_NE(msg.find("libtestlib_missing_dep.so: cannot load plugin library: libtestlib_dep.so: cannot open shared "
                     "object file"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(r.all_entries().empty());
}

TEST(Registry, AnUndefinedSymbolOrANullManifestFieldIsRefusedAtLoad) {
  // Resolved at load: a plugin built against a newer SDK (a core function this core lacks) would
  // otherwise kill the process ("symbol lookup error") at its first call.
  Registry r;
  std::string msg = load_error(r, "libtestlib_undefined_symbol.so");
  EXPECT_NE(msg.find("libtestlib_undefined_symbol.so: cannot load plugin library:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("undefined symbol: testlib_function_no_library_defines"), std::string::npos) << msg;
  msg = load_error(r, "libtestlib_null_build_id.so");
  EXPECT_NE(msg.find("libtestlib_null_build_id.so: plugin manifest has a null field"), std::string::npos) << msg;
  EXPECT_TRUE(r.all_entries().empty());
}

TEST(Registry, APluginsOwnExceptionsAreReadableAfterItsObjectsAreGone) {
  // The exception's type and what() live in the plugin: its library must still be mapped when the
  // registry and the objects that held it were destroyed during the unwinding (it crashed before).
  std::string message;
  try {
    Registry r;
    r.load_library(kLibs + "/libtestlib_own_exceptions.so");
    auto q = r.create<Quantizer>("throwing_test", nlohmann::json::object(), "test");
    q->make_linear(test::cpu_backend(), WeightSource{});
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_EQ(message, "thrown by the plugin's own exception type");
  // A factory's exception of another type becomes an Error naming the plugin.
  Registry r;
  r.load_library(kLibs + "/libtestlib_own_exceptions.so");
  EXPECT_EQ(test::message_of([&] { r.create<Quantizer>("throwing_factory", nlohmann::json::object(), "test"); }),
            "quantizer throwing_factory: type must be number, but is string");
}

TEST(Registry, RefusesTruncatedAndNonElfFilesWithoutLoadingThem) {
  // A library cut short (an interrupted build or copy) would fault inside dlopen; it is refused
  // from its headers, as are files that are not shared libraries at all.
  test::TempDir dir;
  auto error_loading = [](const std::string& path) {
    Registry r;
    return test::message_of([&] { r.load_library(path); });
  };
  const std::string whole = test::read_text(kLibs + "/libtestlib_no_entry.so");
  for (size_t keep : {size_t(100), size_t(5000), whole.size() - 1}) {
    const std::string cut = dir.write("libcut.so", whole.substr(0, keep));
    const std::string msg = error_loading(cut);
    EXPECT_NE(msg.find(cut + ": truncated plugin library"), std::string::npos) << keep << ": " << msg;
  }
  for (const std::string& bytes : {std::string(), std::string("not a library\n")}) {
    const std::string bad = dir.write("libbad.so", bytes);
    const std::string msg = error_loading(bad);
    EXPECT_NE(msg.find(bad + ": not a 64-bit ELF shared library"), std::string::npos) << msg;
  }
}

TEST(Registry, ReportsAFailedRegistrationWithoutThrowingAcrossTheBoundary) {
  Registry r;
  const std::string msg = load_error(r, "libtestlib_throws.so");
  EXPECT_NE(msg.find("deliberate failure"), std::string::npos) << msg;
  EXPECT_TRUE(r.all_entries().empty());
}

TEST(Registry, DuplicateRegistrationNamesBothLibraries) {
  Registry r;
  EXPECT_EQ(load_error(r, "libtestlib_dup_a.so"), "");
  const std::string msg = load_error(r, "libtestlib_dup_b.so");
  EXPECT_NE(msg.find("libtestlib_dup_a.so"), std::string::npos) << msg;
  EXPECT_NE(msg.find("libtestlib_dup_b.so"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dup_test"), std::string::npos) << msg;
  ASSERT_EQ(r.entries(ComponentKind::quantizer).size(), 1u);
  EXPECT_NE(r.entries(ComponentKind::quantizer)[0]->library.find("dup_a"), std::string::npos);
}

TEST(Registry, DirectoryLoadingKeepsGoodLibrariesAndListsRefusals) {
  Registry r;
  r.load_directory(kLibs);  // test libraries are named libtestlib_*, not libtessera_*: nothing loads
  EXPECT_TRUE(r.all_entries().empty());
  r.load_directory(TESSERA_PLUGIN_DIR);
  EXPECT_NE(r.find(ComponentKind::backend, "cpu"), nullptr);
}

TEST(Registry, UnknownPluginListsWhatIsAvailable) {
  try {
    test::plugins().require(ComponentKind::quantizer, "int9");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown quantizer plugin 'int9'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("none"), std::string::npos) << msg;
  }
}

TEST(Registry, ObjectsKeepTheirLibraryLoaded) {
  std::shared_ptr<Decoder> decoder;
  {
    Registry r;
    r.load_library(std::string(TESSERA_PLUGIN_DIR) + "/libtessera_decoder_sampling.so");
    decoder = r.create<Decoder>("sampling", nlohmann::json::object(), "test");
  }  // the registry is gone; the decoder's code must still be mapped
  std::vector<float> logits = {0.1f, 3.0f, 0.2f};
  DecodeItem item;
  item.logits = logits.data();
  item.vocab = 3;
  uint64_t rng = 0;
  item.rng_state = &rng;
  decoder->select(std::span<DecodeItem>(&item, 1));
  EXPECT_EQ(item.tokens, std::vector<int32_t>{1});
  decoder.reset();  // the last holder gone, an accepted library stays mapped (see PluginLibrary)
  void* still = dlopen((std::string(TESSERA_PLUGIN_DIR) + "/libtessera_decoder_sampling.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(still, nullptr);
  if (still != nullptr) dlclose(still);
}

TEST(Registry, ParametersAreValidatedAgainstTheDeclaration) {
  const Registry& r = test::plugins();
  auto msg = [&](const nlohmann::json& params) {
    try {
      r.create<Cache>("contiguous", params, "here.yaml:3");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({{"max_sqes", 4}}).find("unknown parameter 'max_sqes'"), std::string::npos);
  EXPECT_NE(msg({{"max_seqs", "four"}}).find("expected integer, got \"four\""), std::string::npos);
  EXPECT_NE(msg({{"memory", "12 parsecs"}}).find("unknown size unit"), std::string::npos);
  // A malformed number is refused whole, not read up to where it goes wrong.
  for (const char* bad : {"1..5GiB", "1.2.3MiB", "."}) {
    EXPECT_NE(msg({{"memory", bad}}).find("'" + std::string(bad) + "' is not a size"), std::string::npos) << bad;
  }
  EXPECT_NE(msg({{"memory", "0.4B"}}).find("'0.4B' rounds to 0 bytes"), std::string::npos);
  auto scheduler_msg = [&](double timeout) {
    return test::message_of([&] { r.create<Scheduler>("static", {{"timeout", timeout}}, "here.yaml:4"); });
  };
  EXPECT_NE(scheduler_msg(std::nan("")).find("here.yaml:4: parameter 'timeout' is nan: a finite number is expected"),
            std::string::npos)
      << scheduler_msg(std::nan(""));
  EXPECT_NE(scheduler_msg(INFINITY).find("parameter 'timeout' is inf"), std::string::npos);
  EXPECT_NE(msg({{"max_sqes", 4}}).find("here.yaml:3"), std::string::npos);
  EXPECT_EQ(msg({{"memory", "1MiB"}, {"max_seqs", 2}}), "");
}

}  // namespace
}  // namespace tessera
