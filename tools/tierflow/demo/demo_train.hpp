#pragma once
// One training run of the demo's model: its parameters live in a host tier (cold parameters, as
// ZeRO-Infinity keeps them) and are streamed into HBM by the prefetch scheduler for the forward
// and the backward pass, with offload_adam's state in the optimizer_state tier; or, for
// --verify, every weight resident in HBM and the resident Adam over HBM-resident state.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo/demo_options.hpp"
#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/topology.hpp"

namespace tierflow::cli::demo {

/** @brief The optimizer's step against the backward pass (--overlap), from the steps' times.
 *  With `backward` the steps alternate: even steps announce each layer's grad with
 *  grad_ready() during the backward pass, odd steps are plain (the same optimizer, nothing
 *  announced), so the plain step is measured in the same run, interleaved. The first two
 *  steps (warm-up) are left out of the means when the run has at least 4. */
struct overlap_summary {
  std::string overlap = "none";
  double exposed_seconds = 0;           ///< mean step() after the backward, overlapped steps
  double plain_step_seconds = 0;        ///< the same over the plain steps (NaN: none timed)
  double exposed_fraction = 0;          ///< exposed over plain (NaN: no plain step timed)
  double forward_backward_seconds = 0;  ///< mean forward + backward, every timed step
  double iteration_seconds = 0;         ///< mean whole iteration, overlapped steps
  double plain_iteration_seconds = 0;   ///< mean whole iteration, plain steps (NaN: none)
  std::size_t overlapped_steps = 0;     ///< timed steps announced (none: every timed step)
  std::size_t plain_steps = 0;          ///< timed plain steps
};

/** @brief What one training run did. */
struct run_result {
  std::vector<std::vector<float>> final_weights;
  std::vector<double> losses;
  std::vector<double> step_seconds;              // wall time of each training step
  std::vector<double> forward_backward_seconds;  // each step: its start to the backward's end
  std::vector<double> exposed_seconds;           // each step: step() after the backward pass
  std::vector<char> announced;                   // each step: grad_ready() during backward
  std::size_t steps = 0;
  scheduler_metrics sched;
  std::string sched_json;
  std::string trace;
  std::string prometheus;
  std::optional<adam_metrics> adam;
  nlohmann::ordered_json state_pages;  // {class: {"total": pages, "nodes": {node: pages}}}
  placement_snapshot placement;
  double seconds = 0;
};

/** @brief The overlap figures of @p run (see overlap_summary). */
overlap_summary summarize_overlap(const demo_options& o, const run_result& run);

/** @brief The device of --device: `auto`, the first CUDA device when one is usable, else the
 *  emulated one (@p note says why); `cuda` / `cuda:N`, that device; `emulated`.
 *  @throws input_error for another spec, or `cuda` without a usable device */
std::unique_ptr<device> open_demo_device(const demo_options& o, std::string& note);

/** @brief The placement of --placement (else TIERFLOW_PLACEMENT), with no reserve. */
placement_options demo_placement_options(const demo_options& o);

/**
 * @brief One training run of o.steps steps.
 * @param resident every weight in HBM and the resident Adam; otherwise the offloaded path
 * @param quiet no progress lines on stderr
 * @throws input_error for a bad --adam-mode; error when the optimizer skips a step
 */
run_result train(const demo_options& o, device& dev, const topology& topo, bool resident,
                 bool quiet);

}  // namespace tierflow::cli::demo
