#pragma once
// The staging policy of the prefetch scheduler, shared with its model (schedule_model.cpp):
// which step is staged next, whether the window (steps or bytes) and the staging budget allow
// it, which staging ranges a release frees or writes back, and in what order. What each
// decision does is a staging_device's: device streams and events in prefetch_scheduler.cpp,
// simulated clocks in schedule_model.cpp.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "schedule/staging_arena.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow::detail {

/** A buffer of the plan as staging sees it. */
struct staging_buffer {
  std::uint64_t bytes = 0;    // of the tier copy
  std::uint64_t aligned = 0;  // bytes rounded up to the alignment
  bool resident = false;
  // Staging (non-resident buffers): at most one staged copy at a time.
  bool staged = false;
  std::uint64_t offset = 0;      // in the staging arena
  std::uint32_t holders = 0;     // staged steps that use the copy
  std::uint64_t fetched_by = 0;  // seq of the run the copy was fetched for
  bool dirty = false;
  std::uint64_t last_writeback = 0;  // fence seq of its last write-back to the tier
};

/** A step of the plan as staging sees it. */
struct staging_step {
  std::vector<buffer_id> staged;   // the non-resident buffers it uses, sorted, unique
  std::vector<buffer_id> writes;   // sorted, unique
  std::uint64_t staged_bytes = 0;  // aligned
};

/** What the policy's decisions do on the device. Fence sequence numbers start at 1 (0: none);
 *  each sequence (releases, write-backs) is ordered on one stream. */
class staging_device {
 public:
  /** Run @p seq joins the back of the staged runs: copy @p fetched (placed in staging by now;
   *  may be empty) into HBM on the h2d stream once @p after has fired. */
  virtual void stage(std::uint64_t seq, const std::vector<buffer_id>& fetched,
                     const fence& after) = 0;
  /** The front staged run is acquired: its compute waits for its fetch. */
  virtual void launch() = 0;
  /** The front staged run leaves the staged runs at its release: mark the end of its compute;
   *  @p dirty: it changed what it writes. Returns the seq of that release fence. */
  virtual std::uint64_t complete(bool dirty) = 0;
  /** Copy @p ids (non-empty) from staging to their tier copies after the compute just
   *  completed. Returns the seq of the write-back fence of the batch. */
  virtual std::uint64_t write_back(const std::vector<buffer_id>& ids) = 0;

 protected:
  staging_device() = default;
  staging_device(const staging_device&) = default;
  staging_device& operator=(const staging_device&) = default;
  ~staging_device() = default;
};

/** Stages runs of the plan's steps (seq = iteration * steps + step) ahead of the one acquired,
 *  in plan order, wrapping across iterations (unless set_wrap(false)). Not thread-safe, but for
 * window() and staging_used(). */
class staging_policy {
 public:
  staging_policy(staging_device& device, window_unit unit);
  staging_policy(const staging_policy&) = delete;
  staging_policy& operator=(const staging_policy&) = delete;
  ~staging_policy() = default;

  // --- the plan, digested by the caller ---
  void add_buffer(const staging_buffer& b) { buffers_.push_back(b); }
  void add_step(staging_step s) { steps_.push_back(std::move(s)); }
  /** The staging arena: @p capacity bytes (what the resident buffers leave of the budget). */
  void set_arena(std::uint64_t capacity, std::uint64_t alignment);
  [[nodiscard]] const staging_buffer& buffer(buffer_id id) const { return buffers_[id]; }
  [[nodiscard]] const staging_step& step(std::size_t s) const { return steps_[s]; }
  [[nodiscard]] std::size_t buffer_count() const noexcept { return buffers_.size(); }

  // --- the window: W steps ahead, or steps ahead holding at most W bytes ---
  void set_window(std::uint64_t w) noexcept { window_ = w; }
  [[nodiscard]] std::uint64_t window() const noexcept { return window_; }
  /** false: nothing of the next iteration is staged before its first acquire. */
  void set_wrap(bool wrap) noexcept { wrap_ = wrap; }

  // --- where the run stands ---
  [[nodiscard]] bool has_position() const noexcept { return has_position_; }
  /** Seq of the next acquire (or of the acquired run). */
  [[nodiscard]] std::uint64_t position() const noexcept { return position_; }
  [[nodiscard]] bool acquired() const noexcept { return acquired_; }
  /** Prefetches the staging budget held back. */
  [[nodiscard]] std::uint64_t budget_misses() const noexcept { return budget_misses_; }
  [[nodiscard]] const metrics::usage_counter& staging_used() const noexcept { return used_; }

  // --- the decisions ---
  /** Acquires @p step: the position starts there when there is none; the run at the position
   *  is staged if nothing is, launched, and the window pumped. False when that run does not
   *  fit an empty arena (nothing launched). */
  bool acquire(std::size_t step);
  /** Releases the acquired run: completes it, marks what it wrote dirty when @p dirty, frees
   *  the clean copies it held last and writes back the dirty ones, in buffer order. Returns the
   *  buffers written back. Does not pump: the caller pumps when it has filed the run. */
  std::vector<buffer_id> release(bool dirty);
  /** Stages ahead of the position while the window and the staging budget allow. */
  void pump();
  /** A staged copy written back by the caller (flush). */
  void mark_clean(buffer_id id) { buffers_[id].dirty = false; }
  /** With the device idle: forgets everything staged (the caller drops its staged runs).
   *  Returns the bytes of the copies staged ahead that no acquire used. */
  std::uint64_t drop_staged();
  /** After a failure: nothing acquired, and the next acquire starts the iteration after the
   *  position's, from whatever step it names. */
  void restart_after_failure();
  // The next acquire may name any step (counted as the start of a new pass).
  void forget_position();

 private:
  bool try_stage(std::uint64_t seq);
  [[nodiscard]] std::uint64_t ahead() const { return staged_.size() - (acquired_ ? 1 : 0); }
  void unstage(staging_buffer& b);

  staging_device& device_;
  window_unit unit_;
  std::vector<staging_buffer> buffers_;
  std::vector<staging_step> steps_;
  staging_arena arena_{0, 1};
  metrics::usage_counter used_;
  std::deque<std::uint64_t> staged_;  // seqs staged, not yet released (front: the acquired one)
  bool acquired_ = false;
  bool has_position_ = false;
  std::uint64_t position_ = 0;
  std::uint64_t iteration_end_ = 0;  // seq after the last acquired run's iteration
  bool wrap_ = true;
  std::atomic<std::uint64_t> window_{0};
  std::uint64_t budget_misses_ = 0;
};

}  // namespace tierflow::detail
