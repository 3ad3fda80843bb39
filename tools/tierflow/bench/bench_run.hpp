#pragma once
// `tierflow bench`: the cases, and the runner that measures them into one report (JSON keys
// in docs/cli/bench.md).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

namespace tierflow::cli {

/** @brief One case: a stable name, the group it is shown in, and what it measures. */
struct bench_case {
  std::string name;
  std::string group;  ///< node_bandwidth, node_latency, link, link_sweep, adam
  std::string what;
};

/** @brief Every case, in the order they run. */
const std::vector<bench_case>& bench_cases();

/** @brief Whether @p name is selected by @p patterns (each an exact name or a prefix; empty:
 *  all). */
bool case_selected(const std::string& name, const std::vector<std::string>& patterns);

/** @brief Refuses a pattern that selects no case.
 *  @throws input_error naming --case and the pattern */
void check_case_patterns(const std::vector<std::string>& patterns);

/** @brief What a run measures and how. */
struct bench_config {
  std::vector<std::string> cases;  ///< names or prefixes; empty: every case
  int samples = 5;                 ///< timed samples per measurement, after one warm-up
  std::size_t buffer_bytes = 0;    ///< per array; 0: 4 x the last-level cache (8 x for latency)
  std::vector<unsigned> threads;   ///< thread counts; empty: 1, 2, 4, ... and every CPU
  std::string device = "auto";     ///< open_device() spec for the link cases
  std::size_t link_bytes = std::size_t{256} << 20;       ///< bytes per host <-> device copy
  std::vector<std::size_t> chunk_sizes;                  ///< sweep; empty: 64 KiB ... 64 MiB
  std::uint64_t latency_loads = std::uint64_t{1} << 22;  ///< dependent loads per sample
  bool huge_pages = true;  ///< ask for transparent huge pages (false: refuse them)
  /// the Adam cases' p, g, m, v exactly 256 MiB apart (the layout that aliases), not staggered
  bool adam_aliased = false;
  /// the Adam cases run once per dtype of the moments (fp32 first by default), side by side
  std::vector<adam_state_dtype> state_dtypes{adam_state_dtype::f32};
  std::size_t llc_bytes = 0;  ///< the last-level cache the buffer rule uses; 0: detected
};

/** @brief Reports progress: called with (measurements done, measurements planned, label). */
using bench_progress = std::function<void(std::size_t, std::size_t, const std::string&)>;

/**
 * @brief Runs the selected cases on the live machine described by @p topo.
 * @return the report: tierflow_version, date, units, machine, settings, testcases
 * @throws input_error for a bad config (unknown case, no thread count fits)
 */
nlohmann::ordered_json run_bench(const bench_config& config, const topology& topo,
                                 const bench_progress& progress);

/** @brief The size of the largest CPU cache of this machine (bytes; 32 MiB when unknown). */
std::size_t last_level_cache_bytes();

}  // namespace tierflow::cli
