#include "tierflow/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace tierflow {
namespace {

std::string_view level_name(log_level level) {
  switch (level) {
    case log_level::debug:
      return "debug";
    case log_level::info:
      return "info";
    case log_level::warning:
      return "warning";
    case log_level::error:
      return "error";
    case log_level::off:
      return "off";
  }
  return "?";
}

// The level from TIERFLOW_LOG, read once. A bad value is reported (once) and ignored rather
// than thrown: logging must work before anything else is set up.
log_level initial_level(bool& bad_value, std::string& bad_text) {
  const char* text = std::getenv("TIERFLOW_LOG");
  if (text == nullptr || *text == '\0') {
    return log_level::warning;
  }
  const std::string_view value(text);
  for (auto level :
       {log_level::debug, log_level::info, log_level::warning, log_level::error, log_level::off}) {
    if (value == level_name(level)) {
      return level;
    }
  }
  bad_value = true;
  bad_text = value;
  return log_level::warning;
}

struct log_state {
  std::atomic<log_level> level{log_level::warning};
  std::mutex mutex;
  log_sink sink;

  log_state() {
    bool bad = false;
    std::string bad_text;
    level.store(initial_level(bad, bad_text));
    if (bad) {
      std::fprintf(stderr,
                   "tierflow: warning: env TIERFLOW_LOG: expected debug, info, warning, error or "
                   "off: '%s' (using warning)\n",
                   bad_text.c_str());
    }
  }
};

log_state& state() {
  static log_state instance;
  return instance;
}

}  // namespace

void set_log_level(log_level level) noexcept {
  state().level.store(level);
}

log_level get_log_level() noexcept {
  return state().level.load();
}

void set_log_sink(log_sink sink) {
  auto& s = state();
  const std::lock_guard lock(s.mutex);
  s.sink = std::move(sink);
}

namespace detail {
void log(log_level level, std::string_view message) noexcept {
  auto& s = state();
  if (level == log_level::off || level < s.level.load()) {
    return;
  }
  try {
    const std::lock_guard lock(s.mutex);
    if (s.sink) {
      s.sink(level, message);
      return;
    }
  } catch (...) {
    // A throwing sink loses its line; fall through to stderr so the message still shows.
  }
  std::fprintf(stderr, "tierflow: %.*s: %.*s\n", static_cast<int>(level_name(level).size()),
               level_name(level).data(), static_cast<int>(message.size()), message.data());
}
}  // namespace detail

}  // namespace tierflow
