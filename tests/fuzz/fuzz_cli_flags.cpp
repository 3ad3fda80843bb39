// The tierflow command line's flag parsing (tools/tierflow/cli_app.cpp, in tierflow_cli), parse
// only: no command runs. The input is argv[1..] split at NUL bytes; its first byte picks the
// command (topo, bench, demo, tune, plan, or the first token as it is). Either the line parses,
// or it is refused with CLI::Success (--help, --version), a CLI::ParseError, which
// describe_parse_error turns into one non-empty line, or a tierflow::input_error (one line).
// Anything else (another exception, a crash, a sanitizer report) is a finding.
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cli_app.hpp"
#include "fuzz_support.hpp"

namespace {

constexpr const char* commands[] = {"topo", "bench", "demo", "tune", "plan"};
constexpr std::size_t max_tokens = 64;

void expect_one_line(const std::string& message) {
  if (message.empty() || message.find('\n') != std::string::npos) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  std::vector<std::string> tokens{"tierflow"};
  const std::size_t pick = data[0] % 6;
  if (pick < 5) {
    tokens.emplace_back(commands[pick]);
  }
  std::string current;
  for (std::size_t i = 1; i <= size && tokens.size() < max_tokens; ++i) {
    if (i == size || data[i] == 0) {
      tokens.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  if (pick == 5 && tokens.size() == 2 && tokens[1].empty()) {
    tokens.pop_back();  // no command at all
  }
  std::vector<const char*> argv;
  for (const auto& t : tokens) {
    argv.push_back(t.c_str());
  }
  argv.push_back(nullptr);
  const auto cli = tierflow::cli::make_cli_app();
  const int argc = static_cast<int>(tokens.size());
  try {
    const tierflow::cli::action run = tierflow::cli::parse_command_line(*cli, argc, argv.data());
    if (!run) {
      std::abort();  // a parse that succeeded names a command to run
    }
  } catch (const CLI::Success&) {
    // --help, --help-all, --version: main prints and exits 0
  } catch (const CLI::ParseError& e) {
    expect_one_line(tierflow::cli::describe_parse_error(e, argc > 1 ? argv[1] : nullptr));
  } catch (const tierflow::input_error& e) {
    expect_one_line(e.what());
  }
  return 0;
}
