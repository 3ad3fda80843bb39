// tierflow: the command-line tool. Subcommands live in *_command.cpp.

#include <cstdio>
#include <exception>
#include <string>
#include <system_error>
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

// Everything after the first @p marker in @p text, or "" when it is not there.
std::string after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  return at == std::string::npos ? std::string() : text.substr(at + marker.size());
}

// CLI11's parse errors in tierflow's one-line form `SOURCE: PROBLEM: 'TEXT'`.
std::string describe(const CLI::ParseError& e, const char* first_argument) {
  const std::string what = e.what();
  // By type, not get_name(): CLI11 names a subcommand's ExtrasError after the subcommand.
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    return "command line: unknown command, flag or argument (see tierflow --help): '" +
           after(what, ": ") + "'";
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    if (const std::string rest = after(what, "Could not convert: "); !rest.empty()) {
      const auto eq = rest.find(" = ");
      return rest.substr(0, eq) + ": not a valid value: '" +
             (eq == std::string::npos ? std::string() : rest.substr(eq + 3)) + "'";
    }
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    if (const auto at = what.find(": At Most "); at != std::string::npos) {
      return what.substr(0, at) + ": given more than once: '" + what.substr(0, at) + "'";
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
      what.find("subcommand") != std::string::npos) {
    if (first_argument != nullptr && first_argument[0] != '-') {
      return std::string("command line: unknown command (topo, bench, demo or tune): '") +
             first_argument + "'";
    }
    return "command line: a command is required (topo, bench, demo or tune): ''";
  }
  return what;
}

// One error line on stderr; a message that already carries the prefix gets it once.
void print_error(std::string message) {
  for (const std::string prefix : {"tierflow: error: ", "tierflow: "}) {
    if (message.compare(0, prefix.size(), prefix) == 0) {
      message.erase(0, prefix.size());
      break;
    }
  }
  std::fprintf(stderr, "tierflow: error: %s\n", message.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tierflow::cli;
  CLI::App app{
      "tierflow: tiered-memory offload for ML training (memory tiers, bandwidth, "
      "prefetch)"};
  app.set_version_flag("--version", std::string("tierflow ") + TIERFLOW_VERSION_STRING);
  app.require_subcommand(1);
  // A flag given twice is an error, not "the last one wins" (options of every command inherit
  // this; list options such as --case take any number of values anyway).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::Throw);
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
    print_error(describe(e, argc > 1 ? argv[1] : nullptr));
    return exit_bad_input;
  }

  try {
    for (const auto& [command, run] : commands) {
      if (app.got_subcommand(command)) {
        return run();
      }
    }
    print_error("command line: a command is required (topo, bench, demo or tune): ''");
    return exit_bad_input;
  } catch (const tierflow::input_error& e) {
    print_error(e.what());
    return exit_bad_input;
  } catch (const tierflow::environment_error& e) {
    print_error(e.what());
    return exit_environment;
  } catch (const std::system_error& e) {  // a thread or a file the system refused
    print_error(std::string(e.what()) + " (errno " + std::to_string(e.code().value()) + ")");
    return exit_environment;
  } catch (const std::exception& e) {
    print_error(e.what());
    return exit_failure;
  }
}
