#pragma once
// A plan file (tune_plan.hpp) as `tierflow tune`'s workload: its buffers in the params tier and
// each step's compute a timed host callback on the compute stream.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "demo/demo_options.hpp"
#include "tierflow/device.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"
#include "tune/tune_plan.hpp"
#include "tune/tune_sweep.hpp"

namespace tierflow::cli::tune {

/** @brief The scheduler's HBM budget for @p tp at @p window: the resident buffers, room for the
 *  window plus the step running and the one being released (never more than every staged
 *  buffer beside the largest step), and alignment slack. */
std::uint64_t plan_staging_budget(const tune_plan& tp, std::uint64_t window);

/** @brief Holds the plan's host buffers (the params tier, random bytes) for every window of the
 *  sweep. */
struct plan_workload {
  tune_plan tp;
  placement_policy placement;
  std::vector<tier_allocation> host;
  plan_workload(tune_plan parsed, const topology& topo, const demo::demo_options& o);
};

/** @brief Runs @p warmup + @p measured iterations of the plan at @p window; the point's step_s
 *  is the median iteration, from the start of step 0's compute to the next (the scheduler's and
 *  the model's definition). */
tune_point run_plan(plan_workload& w, device& dev, std::uint64_t window, std::size_t warmup,
                    std::size_t measured);

/** @brief What a step costs on @p dev beside compute and copies: a plan of 8 steps with no
 *  compute over 4 KiB buffers, through the scheduler at window 2, its median iteration / 8. */
double probe_step_overhead(device& dev, const topology& topo, const demo::demo_options& o);

}  // namespace tierflow::cli::tune
