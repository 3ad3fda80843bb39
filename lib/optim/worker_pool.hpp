#pragma once
// Threads for the CPU Adam step, each pinned to the CPUs of a NUMA node, that run a batch of
// tasks and report when all are done. The caller blocks meanwhile (it does not compute: on a
// 2-core machine a third busy thread would only take time from the workers).
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tierflow::detail {

class worker_pool {
 public:
  /** One worker per entry of @p nodes, pinned to that node's CPUs (a negative node: unpinned).
   *  @throws environment_error when a thread cannot be started (none are left running) */
  explicit worker_pool(const std::vector<int>& nodes);
  ~worker_pool();
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  /** Starts task(i, worker) for every i in [0, tasks), each once, on the workers; tasks are
   *  taken in increasing i. Returns at once; wait() ends the batch. One batch at a time. */
  void start(std::size_t tasks, std::function<void(std::size_t task, std::size_t worker)> fn);
  /** Adds @p more tasks to the batch in progress (numbered on from the last); the workers take
   *  them as they come. Called by the thread that drives the batch (start, extend, wait). */
  void extend(std::size_t more);
  /** Waits for the batch; rethrows the first exception a task threw (the others still ran). */
  void wait();
  /** start() then wait(). */
  void run(std::size_t tasks, std::function<void(std::size_t task, std::size_t worker)> fn) {
    start(tasks, std::move(fn));
    wait();
  }

  [[nodiscard]] std::size_t size() const noexcept { return threads_.size(); }

 private:
  void work(std::size_t worker, int node);

  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::function<void(std::size_t, std::size_t)> fn_;
  std::size_t tasks_ = 0;
  std::size_t next_ = 0;
  std::size_t finished_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::vector<std::thread> threads_;
};

/** Waits for every pool's batch (each to its end, even after one failed) and returns the first
 *  failure, or nullptr. */
std::exception_ptr wait_all(std::map<int, std::unique_ptr<worker_pool>>& pools) noexcept;

}  // namespace tierflow::detail
