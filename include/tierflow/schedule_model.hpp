#pragma once
/** @file
 * @brief A model of the prefetch scheduler's pipeline (layer `schedule`): predicts the
 * iteration time, stall and staging peak of a plan at a window and an HBM budget from link
 * bandwidths and per-step compute times, without a device.
 *
 * The model replays the scheduler's own host-side decisions (what is staged when, which
 * staging range each fetch is carved from, by the same best-fit arena, and what each range
 * must wait for) and times the device side as three FIFO streams:
 *
 * - h2d: the fetch of a step starts when the h2d stream is free and the ranges it reuses are
 *   free on the device (the compute that released them done, their write-back landed); each
 *   buffer then takes `latency + bytes / bandwidth`;
 * - compute: step i starts when step i-1 is done and its own fetch has landed; it takes
 *   `compute_s[i]`, and the wait for the fetch is its stall;
 * - d2h: the write-back of a step's dirty buffers starts when its compute is done.
 *
 * A half-duplex link serves one transfer at a time in both directions. `tierflow tune`
 * calibrates the inputs (link fits, compute times) and reports the model's error against the
 * measured sweep (BENCHMARKS.md).
 */

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow {

/** @brief One direction of a link: a copy of b bytes takes `latency_s + b / (gbps * 1e9)`. */
struct link_fit {
  double gbps = 0;  ///< > 0
  double latency_s = 0;
  [[nodiscard]] double seconds(std::uint64_t bytes) const noexcept {
    return latency_s + static_cast<double>(bytes) / (gbps * 1e9);
  }
};

/** @brief What the model needs besides the plan. */
struct schedule_model_options {
  std::uint64_t hbm_budget_bytes = 0;  ///< as scheduler_options::hbm_budget_bytes
  std::uint64_t window = 2;            ///< as scheduler_options::window
  window_unit unit = window_unit::steps;
  std::size_t alignment = 256;
  link_fit h2d;
  link_fit d2h;
  bool full_duplex = true;
  /** Iterations simulated; the last one is reported (the steady state). ≥ 2. */
  std::size_t iterations = 4;
  /** Each iteration ends with prefetch_scheduler::flush() (write back, wait, drop what was
   * staged ahead), as a trainer does before its optimizer step changes the tier copies:
   * every iteration then starts from an empty pipeline. */
  bool flush_each_iteration = false;
};

/** @brief The model's prediction for the last simulated iteration. */
struct schedule_prediction {
  /** From the start of step 0's compute to the next (flush_each_iteration: from the idle
   * device at the iteration's start to the end of its flush). */
  double iteration_s = 0;
  double compute_s = 0;  ///< Σ compute
  double stall_s = 0;    ///< compute waiting for fetches
  double stall_fraction = 0;
  double lower_bound_s = 0;  ///< max(Σ compute, Σ h2d time, Σ d2h time), summed if half duplex
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t staging_peak_bytes = 0;  ///< aligned staging held at once (whole simulation)
};

/**
 * @brief Predicts one steady-state iteration of @p plan with @p compute_s[i] seconds of
 * compute for step i. The plan's buffer pointers are not used (may be null).
 * @throws tierflow::error for a bad plan or options: compute times not one per step or
 *         negative, a link without bandwidth, fewer than 2 iterations, a budget too small for
 *         the resident buffers plus the largest step
 */
[[nodiscard]] schedule_prediction predict_schedule(const schedule_plan& plan,
                                                   const std::vector<double>& compute_s,
                                                   const schedule_model_options& options);

}  // namespace tierflow
