// The tierflow command line (cli_app.hpp): the app, its parse, and CLI11's errors in
// tierflow's form.
#include "cli_app.hpp"

#include <cstdio>

#include "tierflow/build_config.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli {

namespace {

// What the errors about the command itself list.
constexpr const char* command_names = "topo, bench, demo, tune or plan";

// Everything after the first @p marker in @p text, or "" when it is not there.
std::string after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  return at == std::string::npos ? std::string() : text.substr(at + marker.size());
}

}  // namespace

std::unique_ptr<cli_app> make_cli_app() {
  auto cli = std::make_unique<cli_app>();
  CLI::App& app = cli->app;
  app.description(
      "tierflow: tiered-memory offload for ML training (memory tiers, bandwidth, prefetch)");
  app.set_version_flag("--version", std::string("tierflow ") + TIERFLOW_VERSION_STRING);
  app.require_subcommand(1);
  // A flag given twice is an error, not "the last one wins" (options of every command inherit
  // this; list options such as --case take any number of values anyway).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  for (auto* add : {add_topo_command, add_bench_command, add_demo_command, add_tune_command,
                    add_plan_command}) {
    action run = add(app);
    const auto all = app.get_subcommands([](CLI::App*) { return true; });
    cli->commands.emplace_back(all.back(), std::move(run));
  }
  return cli;
}

action parse_command_line(cli_app& cli, int argc, const char* const* argv) {
  cli.app.parse(argc, argv);
  for (const auto& [command, run] : cli.commands) {
    if (cli.app.got_subcommand(command)) {
      return run;
    }
  }
  throw input_error("command line", "a command is required (" + std::string(command_names) + ")");
}

namespace {

// @p text with control characters as \xNN: an argument holding a newline made a two-line error.
std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

std::string describe_raw(const CLI::ParseError& e, const char* first_argument) {
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
      return "command line: unknown command (" + std::string(command_names) + "): '" +
             first_argument + "'";
    }
    return "command line: a command is required (" + std::string(command_names) + "): ''";
  }
  return what;
}

}  // namespace

std::string describe_parse_error(const CLI::ParseError& e, const char* first_argument) {
  return one_line(describe_raw(e, first_argument));
}

}  // namespace tierflow::cli
