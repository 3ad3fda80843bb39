#pragma once
// offload_adam's cpu mode (private to lib/optim): grads D2H, the norm and the update on worker
// threads near the state, and the params H2D through a pinned ring of 16-bit slots.
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "optim/adam_core.hpp"
#include "optim/worker_pool.hpp"

namespace tierflow::detail {

class adam_speculation;

class adam_cpu_step {
 public:
  explicit adam_cpu_step(adam_core& core) : core_(core) {}

  /** Starts the worker pools (one per node of the state) and, for 16-bit params, allocates
   *  and registers the upload ring; what it made so far stays here when it throws. */
  void start();
  /** One step (docs/reliability.md, cpu mode). @throws adam_step_error */
  adam_step_result run(adam_step_result result);
  /** The worker pools by node (made by start()). */
  [[nodiscard]] std::map<int, std::unique_ptr<worker_pool>>& pools() noexcept { return pools_; }
  /** The speculation whose work run() completes (overlap = backward), or null; it sends
   *  device params up through this step's upload path (backward_publish). */
  void set_speculation(adam_speculation* speculation);

 private:
  void start_workers();
  void sum_grads(const step_deadline& deadline);
  [[noreturn]] void grads_failed(std::exception_ptr failure);
  void update_and_upload(stream& h2d, const std::vector<adam_scalars>& scalars);
  void upload_chunk(stream& h2d, const chunk_ref& c, std::size_t slot_hint);
  void check_uploads(stream& h2d);

  adam_core& core_;
  std::vector<tier_allocation> ring_;  // 16-bit params on their way to the device
  std::unique_ptr<std::mutex[]> ring_mutex_;
  std::vector<std::unique_ptr<event>> ring_events_;
  std::map<int, std::unique_ptr<worker_pool>> pools_;  // by node (-1: unpinned)
  std::map<int, std::vector<std::size_t>> chunks_by_node_;
  unsigned threads_ = 0;
  adam_speculation* speculation_ = nullptr;
};

}  // namespace tierflow::detail
