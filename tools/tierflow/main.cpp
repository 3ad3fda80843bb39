// tierflow: the command-line tool. Subcommands live in *_command.cpp.

#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "tierflow/build_config.hpp"
#include "tierflow/error.hpp"

namespace {

using tierflow::cli::action;

// Registers one command on @p app: the subcommand @p add adds (the last one), with its action.
std::pair<const CLI::App*, action> add_command(CLI::App& app, action (*add)(CLI::App&)) {
  action run = add(app);
  const auto all = app.get_subcommands([](CLI::App*) { return true; });
  return {all.back(), std::move(run)};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tierflow::cli;
  CLI::App app{
      "tierflow: tiered-memory offload for ML training (memory tiers, bandwidth, "
      "prefetch)"};
  app.set_version_flag("--version", std::string("tierflow ") + TIERFLOW_VERSION_STRING);
  app.require_subcommand(1);
  std::vector<std::pair<const CLI::App*, action>> commands;
  for (auto* add : {add_topo_command, add_bench_command, add_demo_command, add_tune_command,
                    add_plan_command}) {
    commands.push_back(add_command(app, add));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tierflow: error: %s (see tierflow --help)\n", e.what());
    return exit_bad_input;
  }

  try {
    for (const auto& [command, run] : commands) {
      if (app.got_subcommand(command)) {
        return run();
      }
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
