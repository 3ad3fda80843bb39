#pragma once
// offload_adam's speculative step (private to lib/optim; adam_options::overlap = backward, cpu
// mode): grad_ready() starts a param's grads copy down, its Σ g² and its update, scaled as if
// no clipping applied, on the cpu step's workers while the caller's backward pass goes on.
// Each chunk's master, m and v are copied aside before its speculative update, into backups
// allocated once in the placement policy's tiers (class optimizer_state). step() then keeps a
// chunk's update when the step's true scalars are bit for bit those it used, and otherwise
// restores the chunk from its backup (the plain step redoes it); a skipped or failed step
// restores every chunk. The state is thus always bit for bit the plain step's. With
// backward_publish, a chunk's params also get its new values right after its speculative
// update (published_): stored for a param in host memory, sent up on the H2D stream (the cpu
// step's upload path) for a device param; a restore first waits for those copies, then writes
// or sends the restored master weights back. A param in host memory with a master of its own
// (adopts_param_writes) has what was written to it outside the optimizer adopted into its
// master before a chunk's backup, and again when step() or a restore finds the param other
// than the speculation left it.
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "optim/adam_core.hpp"
#include "optim/worker_pool.hpp"

namespace tierflow::detail {

class adam_speculation {
 public:
  /** @param pools the cpu step's worker pools by node (they outlive this object's use) */
  adam_speculation(adam_core& core, std::map<int, std::unique_ptr<worker_pool>>& pools)
      : core_(core), pools_(pools) {}
  adam_speculation(const adam_speculation&) = delete;
  adam_speculation& operator=(const adam_speculation&) = delete;

  /** Allocates the backups (the master and the moments as stored: 12 B per element for fp32
   *  moments, 8 bf16, ~6 int8; in the tiers) and sets rollback_bytes. */
  void allocate();
  /** How a device param's chunk goes up (chunk, ring slot hint); set by the cpu step. */
  void set_uploader(std::function<void(const chunk_ref&, std::size_t)> upload) {
    upload_ = std::move(upload);
  }

  /** Param @p param of group @p group has its final grad: enqueues its grads copy (after the
   *  work on the compute stream so far) and its chunks' norm and update on the workers.
   *  Thread-safe against other grad_ready() calls; not against step(). @p publish false: with
   *  backward_publish, its new params wait for step() (their memory is not writable yet). */
  void grad_ready(std::size_t group, std::size_t param, bool publish = true);
  /** Whether param (@p group, @p param) was announced this step. */
  [[nodiscard]] bool announced(std::size_t group, std::size_t param) const;
  /** Whether chunk @p index's grads were copied and summed by the speculation. */
  [[nodiscard]] bool summed(std::size_t index) const { return any_ && announced_[index] != 0; }
  /** Whether chunk @p index holds a kept speculative update (after settle()). */
  [[nodiscard]] bool updated(std::size_t index) const { return any_ && updated_[index] != 0; }
  /** Whether chunk @p index's kept update is already in its params (backward_publish). */
  [[nodiscard]] bool published(std::size_t index) const { return any_ && published_[index] != 0; }
  [[nodiscard]] bool any() const noexcept { return any_; }
  /** Whether cancel() failed since the last call: the grads announced before it may not have
   *  been copied, and their memory may be gone (a framework frees an announced grad). */
  [[nodiscard]] bool take_lost() noexcept { return std::exchange(lost_, false); }

  /** Waits for the speculative work. On a failure it restores every chunk, ends the
   *  speculation and rethrows (a device_error or device_timeout). */
  void wait();
  /** With the step's true scalars (per slot): keeps each speculative update made with the
   *  same scalars, restores the others. @p clipped: the clip fired this step; the next step
   *  then speculates only the grads' copy and norm, not the update (a clip that fires on
   *  every step would otherwise restore and redo every update). */
  void settle(const std::vector<adam_scalars>& scalars, bool clipped);
  /** Restores every speculatively updated chunk (a skipped or failed step). */
  void roll_back_all() noexcept;
  /** Forgets this step's announcements (after the step, or a failure). */
  void end_step() noexcept;
  /** cancel(), then forgets the announcements (and a lost copy): the grads come again. */
  void discard() noexcept {
    cancel();
    end_step();
    lost_ = false;
  }
  /** Waits, restores every chunk and drops the updates: for calls that read or replace the
   *  state between grad_ready() and step(). The announced grads stay copied and summed (the
   *  caller may have freed them: the step reads those copies); after a failure (logged) the
   *  speculation ends, announcements and all, and take_lost() says so. noexcept: destructors
   *  use it. */
  void cancel() noexcept;

 private:
  void speculate(std::size_t index, std::size_t worker);
  /** Restores chunk @p index's state from its backup; @p republish: and its params, when they
   *  were published (not when the plain step redoes the update and sends them anyway: its
   *  update would rewrite the master weights under that copy). */
  void restore(std::size_t index, bool republish) noexcept;
  /** Chunk @p index (a kept update of a param that adopts_param_writes) has a param other than
   *  the speculation left it (left_in_param() stored as its dtype): written outside the
   *  optimizer since. */
  [[nodiscard]] bool param_written(std::size_t index) const noexcept;
  /** param_written() for every kept chunk that adopts writes, on the workers, into written_. */
  void find_written();
  /** The master whose stored values the speculation left in chunk @p index's param: the new
   *  one when it published them, else the pre-update one in the backup. */
  [[nodiscard]] const float* left_in_param(std::size_t index) const noexcept {
    const chunk_ref& c = core_.chunks[index];
    return published_[index] != 0 ? param_by_slot_[c.slot]->master_p() + c.offset
                                  : static_cast<const float*>(backup_[c.slot].data()) + c.offset;
  }
  void publish(const chunk_ref& c, const param_state& p, std::size_t slot_hint);
  /** Before restoring published device chunks: their copies, which read the master weights,
   *  finish (a failed one leaves the device params stale: re-sent before their next use). */
  void settle_uploads() noexcept;
  [[nodiscard]] bool published_to_device() const;

  adam_core& core_;
  std::map<int, std::unique_ptr<worker_pool>>& pools_;
  std::mutex mutex_;                                 // grad_ready() against itself
  std::vector<tier_allocation> backup_;              // per slot: master, m, v
  std::vector<const param_state*> param_by_slot_;    // per slot
  std::vector<std::vector<std::size_t>> chunks_of_;  // per slot: its chunks
  std::map<int, std::vector<std::size_t>> queue_;    // per node: chunks in the order announced
  std::map<int, std::size_t> queued_;                // per node: entries of queue_ in use
  std::vector<adam_scalars> scalars_;                // per slot: the speculative scalars
  std::vector<step_deadline> deadline_;              // per chunk
  std::vector<char> announced_;                      // per chunk (caller's threads)
  std::vector<char> updated_;                        // per chunk (workers, then step())
  std::vector<char> published_;                      // per chunk (workers, then step())
  std::vector<char> written_;                        // per chunk: find_written()'s finding
  std::vector<float> reference_;  // restore(): the values a param was compared with
  std::function<void(const chunk_ref&, std::size_t)> upload_;
  bool any_ = false;      // something announced this step
  bool running_ = false;  // the pools run a batch of speculate() (grad_ready() starts one)
  bool lost_ = false;     // cancel() failed: the step refuses, the grads must come again
  bool update_ = true;    // speculate updates this step (no clip in the last one)
};

}  // namespace tierflow::detail
