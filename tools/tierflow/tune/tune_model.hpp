#pragma once
// tune's model: the device's links and per-step overhead probed, the demo calibrated by short
// runs, and each setting's step time predicted by predict_schedule().

#include <cstddef>
#include <string>
#include <vector>

#include "demo/demo_options.hpp"
#include "demo/link_probe.hpp"
#include "tierflow/device.hpp"
#include "tierflow/topology.hpp"
#include "tune/tune_plan.hpp"
#include "tune/tune_sweep.hpp"

namespace tierflow::cli::tune {

using demo::link_fits;

/** @brief What the model needs of one (Adam mode, chunk) of the demo, from a short run of it:
 *  each layer step's compute time (the scheduler's per-step accounting) and the Adam step's
 *  time. */
struct demo_calibration {
  std::vector<double> compute_s;
  double adam_s = 0;
  std::uint64_t adam_hbm = 0;
  std::string mode;
};

/** @brief Steps of the calibration's cold run, and the steps timed after them. */
inline constexpr std::size_t calibration_warmup = 1;
inline constexpr std::size_t calibration_steps = 8;

/** @brief The links of @p dev (probe_links) and its per-step overhead (probe_step_overhead). */
link_fits probe_model_links(device& dev, const topology& topo, const demo::demo_options& o);

/** @brief The link fits as JSON, for the report's "model". */
json links_json(const link_fits& links);

/** @brief Calibrates the demo at @p o's mode, chunk and window. */
demo_calibration calibrate_demo(demo::demo_options o, device& dev, const topology& topo);

/** @brief One demo iteration as the model sees it: the batch's two uploads on the compute
 *  stream, the plan pass ending in the flush, then the Adam step (the host waits for it).
 *  Sets @p p's stall and HBM and @p predicted, the step time. */
void predict_demo(const demo::demo_options& o, const demo_calibration& c, const link_fits& links,
                  tune_point& p, double& predicted);

/** @brief One iteration of the plan at @p p's window: sets its stall and HBM and
 *  @p predicted. */
void predict_plan(const tune_plan& tp, const link_fits& links, tune_point& p, double& predicted);

}  // namespace tierflow::cli::tune
