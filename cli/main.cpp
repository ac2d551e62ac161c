// tessera: run, serve, bench, eval and list plugins from the command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace {

// A command's exit status, made 1 where its output could not be written (a full disk, a closed
// pipe): a truncated answer must not look like a complete one.
int checked_exit(int status) {
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::cerr << "error: could not write the output to standard output (disk full, or the output closed?)\n";
    return status == 0 ? 1 : status;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tessera: a Llama-family inference engine built from runtime-loaded plugins"};
  // The plugin ABI and build identity a plugin must match to load (docs/abi_policy.md).
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION + " (plugin ABI " +
                                        std::to_string(TESSERA_ABI_VERSION) + ", build identity '" +
                                        TESSERA_BUILD_ID + "')");
  app.require_subcommand(1);
  tessera::cli::add_run_command(app);
  tessera::cli::add_plugins_command(app);
  tessera::cli::add_eval_command(app);
  tessera::cli::add_synth_command(app);
  tessera::cli::add_serve_command(app);
  tessera::cli::add_bench_command(app);
  tessera::cli::add_tokenize_command(app);
  tessera::cli::set_bench_command_line(argc, argv);
  // CLI11 words an unknown command as a missing one ("A subcommand is required"): name it.
  std::string known;
  bool found = false;
  for (const CLI::App* sub : app.get_subcommands({})) {
    known += (known.empty() ? "" : ", ") + sub->get_name();
    found = found || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !found) {
    std::cerr << "error: unknown command '" << argv[1] << "' (commands: " << known << ")\n";
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad command line exits 1 like every other error (CLI11's own
    // codes, 105 for a value out of range and so on, mean nothing to a script).
    return checked_exit(app.exit(e) == 0 ? 0 : 1);
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return checked_exit(1);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return checked_exit(1);
  }
  return checked_exit(0);
}
