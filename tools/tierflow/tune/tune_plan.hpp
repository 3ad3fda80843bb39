#pragma once
// The workload file of `tierflow tune --plan FILE`: buffers with their sizes, steps with the
// buffers they read and write and their compute time. Parsed with strict validation; no CLI
// dependency, so the fuzz target (tests/fuzz/fuzz_tune_plan.cpp) compiles it directly.
//
//     {"tierflow_plan": 1,
//      "buffers": [{"name": "w0", "bytes": 1048576, "resident": false}],
//      "steps": [{"name": "fwd0", "reads": ["w0"], "writes": [], "compute_ms": 1.5}]}

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow::cli {

/** @brief The largest buffer a plan may name (64 GiB). */
inline constexpr std::uint64_t tune_plan_max_buffer_bytes = std::uint64_t{64} << 30;
/** @brief The most bytes a plan's buffers may hold together (1 TiB: enough to model; a run
 * checks what it can allocate separately). */
inline constexpr std::uint64_t tune_plan_max_total_bytes = std::uint64_t{1} << 40;
/** @brief The most buffers, and the most steps, a plan may have. */
inline constexpr std::size_t tune_plan_max_entries = 100000;
/** @brief The longest compute time of one step (one minute). */
inline constexpr double tune_plan_max_compute_ms = 60000.0;

/** @brief A parsed workload: a schedule_plan whose buffers have no data yet (null), and each
 * step's compute time. */
struct tune_plan {
  schedule_plan plan;
  std::vector<double> compute_s;  ///< one per step, seconds
  std::uint64_t total_bytes = 0;  ///< Σ buffer bytes
};

/**
 * @brief Parses and checks a plan document.
 * @param text the JSON text
 * @param source where it came from (the path), the start of every error message
 * @throws tierflow::input_error naming the problem (one line): not JSON, an unknown version, a
 *         missing, mistyped or unknown key, a duplicate or unknown name, bytes of 0 or above the
 *         caps, a compute time negative, non-finite or above the cap, no buffers or no steps
 */
[[nodiscard]] tune_plan parse_tune_plan(std::string_view text, const std::string& source);

/** @brief Reads @p path and parses it. @throws tierflow::input_error, also when unreadable */
[[nodiscard]] tune_plan load_tune_plan(const std::string& path);

}  // namespace tierflow::cli
