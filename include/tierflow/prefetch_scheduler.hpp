#pragma once
/** @file
 * @brief The prefetch scheduler (layer `schedule`): streams tier-resident buffers into HBM
 * staging slots ahead of the compute steps that use them, writes dirty ones back behind, and
 * accounts every byte and every stall.
 *
 * A plan is an ordered list of steps, each naming the buffers it reads and the buffers it reads
 * and writes; the plan repeats (iteration after iteration) and the prefetch window wraps across
 * the iteration boundary. The user drives it from one thread:
 *
 *     auto& s = sched.acquire(i);            // compute stream now waits for step i's prefetch
 *     launch(s.compute(), s.pointer(w), ...);  // enqueue step i's work on s.compute()
 *     sched.release(i);                       // write-back of step i's writes, slots reused
 *
 * Nothing on this path blocks the host: every dependency (prefetch → compute, compute →
 * write-back, write-back → reuse of the slot or a re-fetch of the same buffer) is an event on
 * the device. Failures of asynchronous work are reported by the first acquire(), release() or
 * flush() that sees them; work after a failed operation does not run on the device, so a tier
 * copy only ever holds a completed write-back.
 */

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tierflow/device.hpp"
#include "tierflow/exporters.hpp"
#include "tierflow/metrics.hpp"

namespace tierflow {

/** @brief Index of a buffer in a schedule_plan. */
using buffer_id = std::uint32_t;

/** @brief A buffer that lives in a host tier (DRAM, CXL): a layer's parameters, a state chunk. */
struct buffer_desc {
  std::string name;      ///< shown in traces and errors; unique in the plan
  void* data = nullptr;  ///< the tier copy: host memory, valid for the scheduler's lifetime
  std::size_t bytes = 0;
  bool resident = false;  ///< kept in HBM for the scheduler's lifetime (hot parameters)
  /** Already page-locked for this device by the caller; otherwise the scheduler registers it
   * with the device (device::host_registration()) for its lifetime. */
  bool pinned = false;
};

/** @brief One compute step of a plan. */
struct step_desc {
  std::string name;
  std::vector<buffer_id> reads;   ///< read only
  std::vector<buffer_id> writes;  ///< read and written: written back after release(dirty)
};

/** @brief Buffers and the steps that use them. */
struct schedule_plan {
  std::vector<buffer_desc> buffers;
  std::vector<step_desc> steps;
  /** @brief Appends a buffer and returns its id. */
  buffer_id add_buffer(buffer_desc buffer);
  /** @brief Appends a step and returns its index. */
  std::size_t add_step(step_desc step);
};

/** @brief What the prefetch window counts. */
enum class window_unit {
  steps,  ///< prefetch the next W steps
  bytes,  ///< prefetch ahead while the steps staged ahead hold at most W bytes
};

/** @brief How a prefetch_scheduler stages. */
struct scheduler_options {
  /** HBM the scheduler may use: resident buffers plus staging slots. It must hold the
   * resident buffers plus the largest step. 0: default_hbm_budget(plan, options), the one
   * default every caller (the C ABI, the session, the streamed Adam step) uses. */
  std::uint64_t hbm_budget_bytes = 0;
  std::uint64_t window = 2;  ///< W, in `unit`; 0 = no prefetch (each step fetched at acquire)
  window_unit unit = window_unit::steps;
  /** Adapt W (steps only): start at 1, grow while compute stalls and the budget allows,
   * shrink while prefetches land a whole step early; never beyond max_window. */
  bool adaptive = false;
  std::uint64_t max_window = 64;
  bool trace = false;           ///< record a Chrome/Perfetto trace (trace_json())
  std::size_t alignment = 256;  ///< of every staging slot (a power of two)
  /** Link bandwidths for the lower bound, GB/s (10^9 B/s), e.g. from `tierflow bench`; 0 =
   * the device's own figure, else the bandwidth the scheduler's transfers achieved. */
  double h2d_gbps = 0.0;
  double d2h_gbps = 0.0;
  /** Stage the next iteration's first steps while the current one ends (true), or only once
   *  its first step is acquired (false): for a caller that changes the tier copies between
   *  iterations (an optimizer step), whose flush() would drop what was staged ahead unused. */
  bool prefetch_across_iterations = true;
};

/** @brief Totals of one plan step over every time it ran. */
struct step_metrics {
  std::string name;
  std::uint64_t runs = 0;
  std::uint64_t bytes_in = 0;         ///< fetched into HBM for it
  std::uint64_t bytes_out = 0;        ///< written back after it
  double compute_seconds = 0;         ///< its work on the compute stream
  double stall_seconds = 0;           ///< compute stream waiting for its prefetch
  std::uint64_t late_prefetches = 0;  ///< runs whose prefetch landed after compute was ready
};

/**
 * @brief A snapshot of a scheduler's accounting, over the steps whose device work has finished.
 *
 * An iteration is one pass over the plan, timed on the device from one start of plan step 0 to
 * the next. `step_time_s` is the median iteration time and `lower_bound_s` the median of each
 * iteration's max(Σ compute, Σ bytes_in / h2d bandwidth, Σ bytes_out / d2h bandwidth) (a
 * half-duplex link adds the two transfer terms); `stall_fraction` is the median of each
 * iteration's stall time / iteration time. Medians keep the first iteration's pipeline fill
 * out of the steady state; `stall_s` and `elapsed_s` hold the totals. With no complete
 * iteration yet, all three are over everything so far, scaled to one iteration.
 */
struct scheduler_metrics {
  double step_time_s = 0;
  double lower_bound_s = 0;
  double overlap_efficiency = 0;  ///< median of each iteration's bound / time (0: not measured)
  double stall_fraction = 0;      ///< median over iterations of stall time / iteration time
  std::uint64_t bytes_in = 0;     ///< total fetched into staging for the runs acquired
  std::uint64_t bytes_out = 0;    ///< total written back
  /** fetched ahead for runs never acquired (dropped by flush() or a failure's recovery) */
  std::uint64_t bytes_discarded = 0;
  std::uint64_t hbm_staging_peak_bytes = 0;
  std::uint64_t hbm_resident_bytes = 0;
  std::uint64_t hbm_budget_bytes = 0;
  std::uint64_t window = 0;  ///< the window now (settled on, when adaptive)
  window_unit unit = window_unit::steps;
  bool adaptive = false;
  std::uint64_t iterations = 0;  ///< complete iterations measured
  std::uint64_t steps = 0;       ///< step runs measured
  std::uint64_t late_prefetches = 0;
  std::uint64_t failed_steps = 0;  ///< step runs discarded after a device failure
  double compute_seconds = 0;
  double stall_seconds = 0;
  double elapsed_seconds = 0;  ///< device time from the first measured step to the last
  double h2d_gbps = 0;         ///< bandwidths the lower bound used
  double d2h_gbps = 0;
  bool full_duplex = true;
  metrics::link_usage h2d;  ///< what the scheduler's transfers achieved
  metrics::link_usage d2h;
  std::vector<step_metrics> per_step;

  /** @brief The scheduler section of a JSON snapshot (keys in docs/scheduler.md). */
  [[nodiscard]] std::string to_json() const;
  /** @brief Adds the `tierflow_scheduler_*` families to @p out. */
  void to_prometheus(metrics::prometheus_writer& out) const;
};

/** @brief The buffers of an acquired step, valid on its compute stream until release(). */
class staged_step {
 public:
  [[nodiscard]] std::size_t step() const noexcept { return step_; }
  [[nodiscard]] std::uint64_t iteration() const noexcept { return iteration_; }
  /** @brief The device pointer of @p id, a buffer of this step or a resident one.
   * @throws tierflow::error for any other buffer */
  [[nodiscard]] void* pointer(buffer_id id) const;
  /** @brief The stream to enqueue this step's work on (the device's compute stream). */
  [[nodiscard]] stream& compute() const noexcept { return *compute_; }

 private:
  friend class prefetch_scheduler;
  std::size_t step_ = 0;
  std::uint64_t iteration_ = 0;
  stream* compute_ = nullptr;
  std::vector<std::pair<buffer_id, void*>> pointers_;  // sorted by id
};

/**
 * @brief Streams a plan's buffers through HBM. Not thread-safe: drive it from one thread
 * (metrics() and the exports may be called from any thread).
 */
class prefetch_scheduler {
 public:
  /**
   * @brief Checks the plan, takes the HBM budget from the device (one allocation), registers
   * host buffers and uploads the resident ones.
   * @throws tierflow::error for a bad plan or options, or a budget too small for the resident
   *         buffers plus the largest step (naming that step); out_of_capacity when the device
   *         cannot give the budget; device_error when the upload fails
   */
  prefetch_scheduler(device& dev, schedule_plan plan, scheduler_options options);
  /** @brief Waits for the device work it enqueued, writes dirty buffers back (a step acquired
   * and not released counts as not dirty), frees its HBM and unregisters host buffers. Never
   * throws (logs). */
  ~prefetch_scheduler();
  prefetch_scheduler(const prefetch_scheduler&) = delete;
  prefetch_scheduler& operator=(const prefetch_scheduler&) = delete;

  /**
   * @brief Makes step @p step's buffers available on the compute stream: the compute stream
   * waits for their prefetch, and the steps after it (the window) are prefetched.
   * Steps go in plan order, wrapping; the first acquire (and the first after a failure) may
   * name any step. The previous step must have been released.
   * @throws tierflow::error for a step out of order or range; device_error when earlier
   *         device work failed (the scheduler then discards what was staged and is usable again)
   */
  const staged_step& acquire(std::size_t step);

  /**
   * @brief Ends step @p step (after its work was enqueued): its `writes` are written back when
   * no later staged step holds them (@p dirty false: the step wrote nothing), and its slots are
   * reused once its work is done.
   * @throws tierflow::error when @p step is not the acquired step; device_error as acquire()
   */
  void release(std::size_t step, bool dirty = true);

  /**
   * @brief Writes every dirty buffer back to its tier, waits for all the scheduler's device
   * work, and drops what was staged ahead, so that the tier copies are current and the host
   * may change them before the next acquire. Resident buffers stay in HBM (written back if
   * dirty). @throws tierflow::error between acquire and release; device_error on failure
   */
  void flush();

  /**
   * @brief flush(), then forgets where in the plan it was: the next acquire may name any step.
   * For a pass that ends early (a forward pass with no backward after it).
   * @throws as flush()
   */
  void restart();
  /** @brief The HBM copy of resident buffer @p id. @throws tierflow::error if not resident */
  [[nodiscard]] void* resident_pointer(buffer_id id) const;

  /** @brief Accounting of the work finished so far (does not wait). */
  [[nodiscard]] scheduler_metrics metrics();
  /** @brief `{"schema_version":N,"scheduler":{...}}`. */
  [[nodiscard]] std::string snapshot_json();
  /** @brief Prometheus text exposition of metrics(). */
  [[nodiscard]] std::string prometheus_text();
  /** @brief The trace so far (Chrome trace JSON; empty trace unless options.trace). */
  [[nodiscard]] std::string trace_json();

  [[nodiscard]] const schedule_plan& plan() const noexcept;
  [[nodiscard]] const scheduler_options& options() const noexcept;
  /** @brief The prefetch window now, in options().unit. */
  [[nodiscard]] std::uint64_t window() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/** @brief The HBM budget a scheduler takes when options.hbm_budget_bytes is 0: the resident
 * buffers plus window + 2 slots of the plan's largest step (the window ahead, the step running
 * and the one whose slots are being released; a byte window: its bytes plus two such slots),
 * every buffer rounded up to options.alignment. @throws tierflow::error when it overflows */
[[nodiscard]] std::uint64_t default_hbm_budget(const schedule_plan& plan,
                                               const scheduler_options& options);

/** @brief The stable name of a window unit (`steps`, `bytes`). */
[[nodiscard]] std::string_view to_string(window_unit unit) noexcept;

}  // namespace tierflow
