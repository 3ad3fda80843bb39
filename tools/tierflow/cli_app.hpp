#pragma once
// The tierflow command line as an object: every command's flags on one CLI11 app, parsed
// without running anything (main.cpp runs the chosen command; the CLI fuzzer only parses).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace tierflow::cli {

/** @brief The app and each command's subcommand with the action that runs it. */
struct cli_app {
  CLI::App app;
  std::vector<std::pair<const CLI::App*, action>> commands;
};

/** @brief Every command registered on a new app (CLI11 apps do not move: hence the pointer). */
[[nodiscard]] std::unique_ptr<cli_app> make_cli_app();

/**
 * @brief Parses @p argv into @p cli; runs nothing.
 * @return the action of the command chosen
 * @throws CLI::Success for --help and --version, CLI::ParseError for bad flags (see
 *         describe_parse_error), tierflow::input_error for a bad value a command checks
 */
action parse_command_line(cli_app& cli, int argc, const char* const* argv);

/** @brief CLI11's parse error @p e in tierflow's one-line form `SOURCE: PROBLEM: 'TEXT'`;
 *  @p first_argument: argv[1] or NULL. */
[[nodiscard]] std::string describe_parse_error(const CLI::ParseError& e,
                                               const char* first_argument);

}  // namespace tierflow::cli
