// tierflow: the command-line tool. The app lives in cli_app.cpp, the commands in *_command.cpp.

#include <cstdio>
#include <exception>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_app.hpp"
#include "commands.hpp"
#include "tierflow/error.hpp"

namespace {

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
  const auto cli = make_cli_app();
  try {
    action run;
    try {
      run = parse_command_line(*cli, argc, argv);
    } catch (const CLI::Success& e) {  // --help, --help-all, --version
      return cli->app.exit(e);
    } catch (const CLI::ParseError& e) {
      print_error(describe_parse_error(e, argc > 1 ? argv[1] : nullptr));
      return exit_bad_input;
    }
    return run();
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
