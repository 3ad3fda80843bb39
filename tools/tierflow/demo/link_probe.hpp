#pragma once
// The device's links, measured: what `demo` reports as benchmarked and what `tune`'s model
// predicts with.

#include <cstddef>
#include <cstdint>

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
  /** Bytes the probe copied, both directions together. */
  std::uint64_t probe_bytes = 0;
};

/** @brief What the probe of one direction copies: @p batches of @p per_batch copies of
 *  @p small bytes, then of @p large bytes (after a warm-up batch of small copies if
 *  @p warm_up). */
struct probe_plan {
  std::size_t small = 0;
  std::size_t large = 0;
  int batches = 0;
  int per_batch = 0;
  bool warm_up = false;
};

/** @brief The pilot copy of each direction, before its plan is chosen. */
inline constexpr std::size_t probe_pilot_bytes = std::size_t{64} << 10;

/** @brief Bytes @p plan copies (the pilot not counted). */
[[nodiscard]] std::uint64_t plan_bytes(const probe_plan& plan);

/**
 * @brief The plan of a direction whose pilot copy (probe_pilot_bytes) took @p pilot_seconds.
 *
 * A link on which the full plan (a warm-up, then 5 batches of 8 copies of 64 KiB and of 8 MiB:
 * 335 MiB) fits in a second gets it. A slower one gets 3 batches of 2 copies, of sizes (powers
 * of two, large from 64 KiB to 8 MiB, small = large / 32 from 4 KiB to 64 KiB) that the pilot's
 * pace fits in about a second, and one copy of each size when a copy alone costs that much (a
 * long latency): the slowest link the emulated device takes (1 MB/s) is probed in about 2 s,
 * not the 11 minutes of the full plan.
 */
[[nodiscard]] probe_plan plan_probe(double pilot_seconds);

/** @brief Per direction, a pilot copy, then the copies of plan_probe() in batches on @p dev;
 *  per size the median over batches of (batch time / copies); latency and bandwidth from the
 *  line through the two points. step_overhead_s is left 0. */
link_fits probe_links(device& dev);

}  // namespace tierflow::cli::demo
