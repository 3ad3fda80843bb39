#pragma once
/** @file
 * @brief The offload session (layer `session`): the one object a trainer holds. It discovers
 * the topology and builds the placement once, owns the device, the weight plan (cold weights in
 * blocks, streamed through HBM forward then backward), the prefetch scheduler and the optimizer,
 * and enforces what composing them by hand leaves to the caller: the optimizer never writes a
 * weight's tier copy while the scheduler may still read it.
 *
 * A training iteration, from one thread:
 *
 *     for (b = 0; b < blocks; ++b) { auto& s = sess.acquire(b, pass_direction::forward);
 *                                    run(s); sess.release(); }
 *     for (b = blocks; b-- > 0;)    { auto& s = sess.acquire(b, pass_direction::backward);
 *                                    run(s); sess.release(); }   // the pass ends by itself
 *     sess.optimizer().step();
 *
 * A pass may skip blocks (they go by in order) or end early (a forward pass without a backward:
 * end_pass(), or the next forward of block 0 starts a new pass). Any optimizer call that may
 * write the weights' tier copies (step, sync_params, load, state accessors) first ends an open
 * pass (the scheduler's flush: nothing staged or in flight); grad_ready() with overlap
 * backward_publish writes a weight's new values early only once the backward pass has reached
 * its block; before that they wait for step().
 */

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/topology.hpp"

namespace tierflow {

/** @brief One cold weight of the plan. */
struct session_weight {
  std::string name;       ///< unique in the session (empty: made up from its block and index)
  std::size_t bytes = 0;  ///< > 0
  /** Its tier copy, host memory that outlives the session; nullptr: the session allocates it
   * in a host tier (class `params` of its placement) and frees it with itself. */
  void* data = nullptr;
  /** Kept in HBM for the session's lifetime (a hot weight), never staged; its HBM copy is
   * resident_pointer(), written back to the tier copy when the session ends. */
  bool resident = false;
};

/** @brief How a session stages its weights. */
struct session_options {
  std::uint64_t window = 2;  ///< blocks staged ahead of the one running
  /** HBM for the staging; 0: default_hbm_budget() of the plan (the scheduler's default). */
  std::uint64_t hbm_budget_bytes = 0;
  bool adaptive = false;  ///< the window adapts to stalls, within the budget
  bool trace = false;     ///< record a Perfetto trace (scheduler().trace_json())
  /** The placement of the weights it allocates and of the optimizer's state (its spec, as
   * TIERFLOW_PLACEMENT takes; unset: TIERFLOW_PLACEMENT, else the defaults). */
  placement_options placement;
};

/**
 * @brief The plan a session streams @p blocks with: a buffer per weight (named as given, else
 * `block<b>.w<j>`; its data as given, null where the session would allocate it), then 2 x
 * blocks steps: `fwd<b>` over the blocks in order, `bwd<b>` in reverse, each using its block's
 * weights. For a model of the pipeline (predict_schedule) before any memory exists.
 * @throws tierflow::error for no blocks, an empty block, a zero size or a duplicate name
 */
[[nodiscard]] schedule_plan session_plan(const std::vector<std::vector<session_weight>>& blocks);

/** @brief Which half of a training pass a block runs in. */
enum class pass_direction { forward, backward };

/**
 * @brief Topology, placement, device, weight plan, scheduler and optimizer in one object.
 *
 * Not thread-safe, except that grad_ready() on its optimizer may come from another thread (a
 * framework's autograd thread) while the pass goes on. The optimizers and the scheduler live as
 * long as the session (an optimizer until drop_optimizer()).
 */
class session {
 public:
  /**
   * @brief Discovers the topology (or takes @p topo) and builds the placement, once.
   * @throws tierflow::error for a null device; input_error for a bad placement spec
   */
  session(std::shared_ptr<device> dev, session_options options);
  session(std::shared_ptr<device> dev, topology topo, session_options options);
  /** @brief Ends an open pass (writing nothing back: weights are read-only in the pass), then
   * frees the optimizer, the scheduler and the weights it allocated. Never throws. */
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  [[nodiscard]] device& dev() const noexcept;
  [[nodiscard]] const std::shared_ptr<device>& shared_device() const noexcept;
  [[nodiscard]] const topology& topo() const noexcept;
  [[nodiscard]] placement_policy& placement() noexcept;
  [[nodiscard]] const session_options& options() const noexcept;

  /**
   * @brief Sets the weight plan: @p blocks[b] are block b's weights. The plan is 2 x blocks
   * steps (forward over the blocks, then backward over them in reverse), each using its
   * block's weights; nothing of the next pass is staged before it starts. Allowed once.
   * @p initialize (may be empty) is called with each weight's index and tier copy once the
   * copies exist and before anything is staged or uploaded (resident weights are uploaded
   * from them here): to write the initial values.
   * @throws tierflow::error for no blocks, an empty block, a zero size, a duplicate name, a
   *         second call; out_of_capacity when the tiers or HBM cannot hold it
   */
  void set_blocks(std::vector<std::vector<session_weight>> blocks,
                  const std::function<void(std::size_t, void*)>& initialize = {});
  [[nodiscard]] std::size_t block_count() const noexcept;
  [[nodiscard]] std::size_t weight_count() const noexcept;
  /** @brief How many weights block @p block holds. @throws error out of range */
  [[nodiscard]] std::size_t block_size(std::size_t block) const;
  /** @brief The session-wide index of weight @p index of block @p block. @throws error */
  [[nodiscard]] std::size_t weight(std::size_t block, std::size_t index) const;
  /** @brief The block weight @p weight belongs to. @throws error out of range */
  [[nodiscard]] std::size_t block_of(std::size_t weight) const;
  /** @brief Weight @p weight's tier copy (host memory). Read or write it only while no pass is
   * open (after end_pass() or before the first acquire). @throws error out of range */
  [[nodiscard]] void* weight_host(std::size_t weight) const;
  [[nodiscard]] std::size_t weight_bytes(std::size_t weight) const;
  /** @brief The HBM copy of a resident weight. @throws tierflow::error if not resident */
  [[nodiscard]] void* resident_pointer(std::size_t weight) const;
  [[nodiscard]] const std::string& weight_name(std::size_t weight) const;
  /** @brief The tier the session allocated weight @p weight in (e.g. `dram0`, or
   * `dram0:3+cxl0:1` when interleaved); empty for memory the caller gave. */
  [[nodiscard]] const std::string& weight_tier(std::size_t weight) const;

  /**
   * @brief Stages block @p block for @p direction (releasing the block held, if any): its
   * weights' HBM pointers are valid on the returned step's compute stream until release().
   * Blocks the pass skipped go by in order; a block behind the pass's position starts a new
   * pass. @throws tierflow::error out of range, or with no plan; device_error as the scheduler
   */
  const staged_step& acquire(std::size_t block, pass_direction direction);
  /** @brief Ends the block acquired (a no-op when none is); the pass ends by itself after
   * block 0's backward. @throws device_error as the scheduler */
  void release();
  /** @brief Ends the pass (a forward pass without backward, an exception halfway): nothing
   * stays staged or in flight, the tier copies are current. A no-op when none is open. */
  void end_pass();
  /** @brief Whether a pass is open (a block acquired since the last end). */
  [[nodiscard]] bool pass_open() const noexcept;
  /** @brief Passes ended so far. */
  [[nodiscard]] std::uint64_t passes() const noexcept;
  /** @brief The scheduler of the plan. @throws tierflow::error before set_blocks() */
  [[nodiscard]] prefetch_scheduler& scheduler();
  /** @brief Whether set_blocks() was called. */
  [[nodiscard]] bool has_plan() const noexcept;

  /**
   * @brief Makes an optimizer of the session over @p groups, its state placed by the session's
   * placement, and returns it (optimizer() from now on). A param whose `weight` is set names a
   * session weight: its `param` becomes the weight's tier copy, `param_on_host` true (its
   * dtype and elements must fill the weight's bytes). An optimizer made before stays until
   * dropped (a framework that rebuilds its optimizer carries the state over from the old one).
   * @throws as offload_adam's constructor; tierflow::error for a weight out of range or whose
   *         size does not match
   */
  offload_adam& make_optimizer(std::vector<adam_group> groups, adam_options options);
  /** @brief The optimizer made last. @throws tierflow::error when there is none */
  [[nodiscard]] offload_adam& optimizer();
  [[nodiscard]] bool has_optimizer() const noexcept;
  /** @brief Frees @p opt, an optimizer of this session (a no-op for any other). */
  void drop_optimizer(const offload_adam& opt) noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tierflow
