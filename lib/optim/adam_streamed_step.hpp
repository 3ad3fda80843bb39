#pragma once
// offload_adam's streamed mode (private to lib/optim): the norm pass on the device, then the
// prefetch scheduler streams each chunk's master weights and moments through HBM, where the
// device kernel updates them and the device params, with a pre-step snapshot of each chunk in
// the HBM undo ring; a failed step is recovered by streamed_recovery.
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/adam_core.hpp"
#include "optim/adam_recovery.hpp"
#include "optim/adam_undo_ring.hpp"

namespace tierflow::detail {

class adam_streamed_step {
 public:
  explicit adam_streamed_step(adam_core& core) : core_(core), undo_(core), recovery_(core, undo_) {}

  /** Makes the scheduler (in core.scheduler), the device side and the undo ring; what it
   *  made so far stays here when it throws. */
  void build();
  /** One step (docs/reliability.md, streamed mode). @throws adam_step_error */
  adam_step_result run(adam_step_result result);
  [[nodiscard]] streamed_recovery& recovery() noexcept { return recovery_; }

 private:
  void norm_pass();
  void stream_chunk(const chunk_ref& c, const std::vector<adam_scalars>& scalars,
                    std::optional<std::size_t>& acquired);
  [[noreturn]] void recover(adam_step_result result, const std::vector<adam_scalars>& scalars,
                            std::optional<std::size_t> acquired, const std::string& failure);

  adam_core& core_;
  // Per chunk: its master's buffer, then its moments' (m, v and for int8 their scales).
  std::vector<std::vector<buffer_id>> chunk_buffers_;
  std::unique_ptr<device_adam> device_side_;
  hbm_undo_ring undo_;
  streamed_recovery recovery_;
  std::vector<char> written_back_;  // per chunk: its write-back event was recorded
  // Whether an event recorded after a chunk's release covers its write-back: not when the
  // window spans the plan (a chunk staged again for the next pass defers its write-back).
  bool trust_writeback_events_ = false;
};

}  // namespace tierflow::detail
