#pragma once
// offload_adam's recovery (private to lib/optim; docs/reliability.md): re-sending params that
// a failed call left behind the master weights, and streamed mode's way out of a failed step:
// roll back, roll forward on the host, or leave the step pending and complete it later.
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "optim/adam_core.hpp"
#include "optim/adam_undo_ring.hpp"

namespace tierflow::detail {

/** Re-sends every param from the master weights (after dropping the scheduler's prefetches);
 *  false (with the reason) when that fails, the params then left stale. */
bool try_upload_params(adam_core& core, std::string& failure);
/** Re-sends the params when a failed call left them stale (no-op otherwise).
 *  @throws adam_step_error (not_applied) naming @p during when that fails again */
void resend_stale_params(adam_core& core, const char* during);

/** A streamed step that a second fault left half done. */
struct pending_step {
  std::vector<std::size_t> chunks;  // at the pre-step state once `restore` is done
  std::vector<adam_scalars> scalars;
  // (chunk, undo slot): chunks to copy back from the HBM undo ring first (their restore
  // failed); those slots are not reused while the step is pending.
  std::vector<std::pair<std::size_t, std::size_t>> restore;
  adam_step_result result;
};

class streamed_recovery {
 public:
  streamed_recovery(adam_core& core, hbm_undo_ring& undo) : core_(core), undo_(undo) {}

  [[nodiscard]] bool pending() const noexcept { return pending_.has_value(); }
  void drop_pending() noexcept { pending_.reset(); }

  /** Ends a failed streamed step once the device is idle: @p done marks the chunks whose
   *  write-back surely landed (@p done_count of them). The others are restored from the undo
   *  ring, then the step is rolled back (none landed) or completed on the host; a second
   *  fault leaves it pending. @throws adam_step_error, always, naming @p failure */
  [[noreturn]] void settle(adam_step_result result, const std::vector<adam_scalars>& scalars,
                           const std::vector<char>& done, std::size_t done_count,
                           const std::string& failure);
  /** Completes the pending step: the restore that failed, then the update on the host.
   *  @throws adam_step_error (pending) when that fails again; (applied) when only the params
   *  upload after it failed */
  adam_step_result complete_pending();

 private:
  bool finish_on_host(const std::vector<std::size_t>& rest,
                      const std::vector<adam_scalars>& scalars, std::string& failure);
  void resend_params(std::string& text);

  adam_core& core_;
  hbm_undo_ring& undo_;
  std::optional<pending_step> pending_;
};

}  // namespace tierflow::detail
