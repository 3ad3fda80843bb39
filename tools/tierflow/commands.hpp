#pragma once
// The tierflow CLI's subcommands. Each registers its options on the app and returns the action
// to run when it was chosen; actions return the process exit code.

#include <exception>
#include <functional>
#include <system_error>

#include <CLI/CLI.hpp>

#include "tierflow/error.hpp"

namespace tierflow::cli {

/** Exit codes: 0 success, 1 failure while running, 2 bad input (arguments, files, env), 74
 *  the machine refused (sysexits' EX_IOERR: a full disk, a read-only or permission-denied
 *  folder, the mlock limit, a thread that could not start; docs/errors.md). */
inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1;
inline constexpr int exit_bad_input = 2;
inline constexpr int exit_environment = 74;

/** The exit code that says whose fault @p failure is: exit_bad_input (input_error),
 *  exit_environment (environment_error, std::system_error) or exit_failure. */
inline int exit_code_for(const std::exception& failure) noexcept {
  if (dynamic_cast<const input_error*>(&failure) != nullptr) {
    return exit_bad_input;
  }
  if (dynamic_cast<const environment_error*>(&failure) != nullptr ||
      dynamic_cast<const std::system_error*>(&failure) != nullptr) {
    return exit_environment;
  }
  return exit_failure;
}

using action = std::function<int()>;

/** `tierflow topo`: the machine's memory tiers as a table or JSON. */
action add_topo_command(CLI::App& app);

/** `tierflow bench`: memory tiers and links measured (bench_command.cpp). */
action add_bench_command(CLI::App& app);

/** `tierflow demo`: trains a model with its weights and Adam state offloaded
 *  (tools/tierflow/demo/demo_command.cpp). */
action add_demo_command(CLI::App& app);

/** `tierflow tune`: sweeps the window (× Adam chunk and mode on the demo's model) on the demo's
 *  model or a plan file, measured or predicted (tools/tierflow/tune/tune_command.cpp). */
action add_tune_command(CLI::App& app);

/** `tierflow plan`: sizes a training run on paper from a JSON spec: bytes per tier, per-step
 *  link bounds, the bottleneck (tools/tierflow/plan/plan_command.cpp). */
action add_plan_command(CLI::App& app);

}  // namespace tierflow::cli
