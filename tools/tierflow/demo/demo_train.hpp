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

/** @brief What one training run did. */
struct run_result {
  std::vector<std::vector<float>> final_weights;
  std::vector<double> losses;
  std::vector<double> step_seconds;  // wall time of each training step
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
