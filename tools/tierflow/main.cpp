// tierflow: the command-line tool. Subcommands live in *_command.cpp.

#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "tierflow/build_config.hpp"
#include "tierflow/error.hpp"

int main(int argc, char** argv) {
  using namespace tierflow::cli;
  CLI::App app{
      "tierflow: tiered-memory offload for ML training (memory tiers, bandwidth, "
      "prefetch)"};
  app.set_version_flag("--version", std::string("tierflow ") + TIERFLOW_VERSION_STRING);
  app.require_subcommand(1);
  const auto topo = add_topo_command(app);
  const auto bench = add_bench_command(app);
  const auto demo = add_demo_command(app);
  const auto tune = add_tune_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tierflow: error: %s (see tierflow --help)\n", e.what());
    return exit_bad_input;
  }

  try {
    if (app.got_subcommand("topo")) {
      return topo();
    }
    if (app.got_subcommand("bench")) {
      return bench();
    }
    if (app.got_subcommand("demo")) {
      return demo();
    }
    if (app.got_subcommand("tune")) {
      return tune();
    }
    std::fprintf(stderr, "tierflow: error: no command given (see tierflow --help)\n");
    return exit_bad_input;
  } catch (const tierflow::input_error& e) {
    std::fprintf(stderr, "tierflow: error: %s\n", e.what());
    return exit_bad_input;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierflow: error: %s\n", e.what());
    return exit_failure;
  }
}
