#pragma once
// The registry of `tierflow bench`'s cases. Each case is an object: its name, group and
// description, what it needs of the machine, how many measurements it makes at one site, and
// the function that measures it. Cases that share a setup (buffers, a thread team, a device
// copy engine) form a case_group, one file per group (cases_node.cpp, cases_link.cpp,
// cases_adam.cpp); adding a case is adding one entry to its group's list.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_fixtures.hpp"

namespace tierflow::cli {

/** @brief What a case needs of the machine beyond a NUMA node with CPUs to run from. */
enum class case_need {
  cpu_node,  ///< nothing more: memory on each target node
  device,    ///< a device (a CUDA GPU or the emulated one); without one the case is waived
};

/** @brief Where a group's cases run: from every initiator to every node, or from the first
 *  initiator to each node. */
enum class case_site { every_pair, first_initiator };

/** @brief What a group sets up once at a site and hands to each of its cases there. */
struct site_fixture {
  virtual ~site_fixture() = default;
};

/** @brief Where a case runs now: initiator, target and (for the threaded cases) threads. */
struct bench_site {
  const numa_node& from;
  const numa_node& to;
  unsigned threads = 1;
};

/** @brief One registered case. */
struct registered_case {
  bench_case info;  ///< name, group, what it measures
  case_need need = case_need::cpu_node;
  /** Measurements it makes at a site run from @p from (for the progress bar). */
  std::function<std::size_t(const bench_config&, const numa_node& from)> measurements;
  /** Measures at @p site over the group's @p fixture, appending to ctx.testcases. */
  std::function<void(run_context& ctx, site_fixture& fixture, const bench_site& site)> run;
};

/** @brief Cases that share a setup. */
struct case_group {
  case_site site = case_site::every_pair;
  std::vector<registered_case> cases;
  /** Sets up at (@p from, @p to) and runs each of @p selected (a subset of cases, in order),
   *  or waives them there with the reason. */
  std::function<void(run_context& ctx, const numa_node& from, const numa_node& to,
                     const std::vector<const registered_case*>& selected)>
      run_site;
};

/** @brief Every group, in the order they run. */
const std::vector<case_group>& case_groups();

/** @brief The groups of cases, one per file. */
case_group node_bandwidth_group();
case_group node_latency_group();
case_group link_group();
case_group adam_group();

}  // namespace tierflow::cli
