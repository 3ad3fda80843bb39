#pragma once
// Starting threads: a thread the system will not create (the process's or the user's thread
// limit, no memory for its stack) is the environment's failure, environment_error, not a
// std::system_error that callers would report as an internal error.

#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow::detail {

/**
 * @brief A thread running @p fn, for a thread the caller cannot do without.
 * @param what who starts it, for the message, e.g. `offload_adam workers`
 * @throws environment_error (resource `thread`, the errno) when it cannot be started
 */
template <typename F>
std::thread start_thread(const std::string& what, F&& fn) {
  try {
    return std::thread(std::forward<F>(fn));
  } catch (const std::system_error& e) {
    throw environment_error(what + ": cannot start a thread", "thread", e.code().value());
  }
}

/**
 * @brief Starts up to @p count helper threads running @p fn into @p threads, for work that the
 * started ones share (a helper that cannot start leaves its share to the others): stops at the
 * first that the system refuses, with a warning. Returns how many it started.
 */
template <typename F>
std::size_t start_helpers(std::vector<std::thread>& threads, std::size_t count,
                          const std::string& what, const F& fn) {
  std::size_t started = 0;
  for (; started < count; ++started) {
    try {
      threads.emplace_back(fn);
    } catch (const std::system_error& e) {
      log(log_level::warning, what + ": started " + std::to_string(started) + " of " +
                                  std::to_string(count) + " helper threads (" + e.what() +
                                  "); the work goes on with fewer");
      break;
    }
  }
  return started;
}

}  // namespace tierflow::detail
