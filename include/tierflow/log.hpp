#pragma once
/** @file
 * @brief tierflow's diagnostic log: one line per event, to stderr unless a sink is installed.
 *
 * The level starts from the environment variable `TIERFLOW_LOG` (`debug`, `info`, `warning`,
 * `error` or `off`; default `warning`). Logging never throws and is safe from any thread.
 */

#include <functional>
#include <string_view>

namespace tierflow {

/** @brief Severity of a log line, in increasing order. */
enum class log_level { debug, info, warning, error, off };

/** @brief Receives each log line that passes the level (without a trailing newline). */
using log_sink = std::function<void(log_level, std::string_view)>;

/** @brief Sets the lowest level that is logged. */
void set_log_level(log_level level) noexcept;

/** @brief The lowest level that is logged. */
[[nodiscard]] log_level get_log_level() noexcept;

/** @brief Routes log lines to @p sink; an empty sink restores the stderr default. */
void set_log_sink(log_sink sink);

namespace detail {
/** @brief Logs @p message at @p level; never throws. */
void log(log_level level, std::string_view message) noexcept;
}  // namespace detail

}  // namespace tierflow
