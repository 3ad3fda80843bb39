#pragma once
// Runs the tierflow CLI as a user does (tests/cli/test_*.cpp): a process of its own, its exit
// code, stdout and stderr, with a fresh measured-attribute cache and no tier overrides from the
// environment. TIERFLOW_CLI_PATH is the binary (tests/cli/CMakeLists.txt).

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <sys/wait.h>

#include "test_support.hpp"

namespace tierflow::test::cli {

/** What one run of the CLI gave. */
struct run_result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string quote(const std::string& arg) {
  std::string q = "'";
  for (char c : arg) {
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return q + "'";
}

inline run_result run_cli(const std::vector<std::string>& args, const std::string& env = "") {
  tierflow::test::scratch_dir dir;
  const auto err_path = dir.path() / "stderr";
  // A fresh measured-attribute cache: neither the user's nor another test's (env may set one).
  std::string command = "env -u TIERFLOW_TIERS -u TIERFLOW_CONFIG " +
                        quote("TIERFLOW_CACHE_DIR=" + (dir.path() / "cache").string()) + " " + env +
                        " " + quote(TIERFLOW_CLI_PATH);
  for (const auto& a : args) {
    command += " " + quote(a);
  }
  command += " 2>" + quote(err_path.string());
  run_result result;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    result.out.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = tierflow::test::read_file(err_path);
  return result;
}

// How often @p what occurs in @p text (overlapping ones too).
inline std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// Bad input: exit code 2, nothing on stdout, one line on stderr that names @p expected.
inline void check_one_line_error(const run_result& r, const std::string& expected) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());  // never a partial table
  CHECK_THAT(r.err, Catch::StartsWith("tierflow: error: "));
  CHECK_THAT(r.err, Catch::Contains(expected));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

/** A failure the machine caused (docs/errors.md): one line naming @p expected and the errno,
 *  exit code 74, nothing on stdout. */
inline void check_environment_error(const run_result& r, const std::string& expected) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 74);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Catch::StartsWith("tierflow: error: "));
  CHECK_THAT(r.err, Catch::Contains(expected) && Catch::Contains("(errno "));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

}  // namespace tierflow::test::cli
