#pragma once
// The device's links, measured: what `demo` reports as benchmarked and what `tune`'s model
// predicts with.

#include "tierflow/device.hpp"
#include "tierflow/schedule_model.hpp"

namespace tierflow::cli::demo {

/** @brief The inputs of predict_schedule besides the plan: the device's links, fitted by a
 *  probe. */
struct link_fits {
  link_fit h2d;
  link_fit d2h;
  bool full_duplex = true;
  /** What a step costs beside its compute and copies (callbacks, event handoffs between the
   * device's threads): from probe_step_overhead(), added to every step's compute time. */
  double step_overhead_s = 0;
};

/** @brief Copies of two sizes (64 KiB and 8 MiB) in batches on @p dev; per size the median over
 *  batches of (batch time / copies); latency and bandwidth from the line through the two
 *  points. step_overhead_s is left 0. */
link_fits probe_links(device& dev);

}  // namespace tierflow::cli::demo
