#include "optim/worker_pool.hpp"

#include "core/threads.hpp"
#include "platform/numa.hpp"

namespace tierflow::detail {

worker_pool::worker_pool(const std::vector<int>& nodes) {
  threads_.reserve(nodes.size());
  try {
    for (std::size_t w = 0; w < nodes.size(); ++w) {
      threads_.push_back(
          start_thread("offload_adam workers", [this, w, node = nodes[w]] { work(w, node); }));
    }
  } catch (...) {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) {
      t.join();
    }
    throw;
  }
}

worker_pool::~worker_pool() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) {
    t.join();
  }
}

void worker_pool::start(std::size_t tasks, std::function<void(std::size_t, std::size_t)> fn) {
  const std::lock_guard lock(mutex_);
  fn_ = std::move(fn);
  tasks_ = tasks;
  next_ = 0;
  finished_ = 0;
  failure_ = nullptr;
  start_cv_.notify_all();
}

void worker_pool::extend(std::size_t more) {
  const std::lock_guard lock(mutex_);
  tasks_ += more;
  start_cv_.notify_all();
}

void worker_pool::wait() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return finished_ == tasks_; });
  fn_ = nullptr;
  tasks_ = 0;
  if (failure_) {
    std::exception_ptr failure = nullptr;
    std::swap(failure, failure_);
    std::rethrow_exception(failure);
  }
}

void worker_pool::work(std::size_t worker, int node) {
  if (node >= 0) {
    (void)platform::run_on_node(node);  // best effort: an unpinned worker still computes right
  }
  std::unique_lock lock(mutex_);
  for (;;) {
    // A batch may grow while it runs (extend()), so a worker looks for tasks, not batches.
    start_cv_.wait(lock, [&] { return stopping_ || next_ < tasks_; });
    if (stopping_) {
      return;
    }
    while (next_ < tasks_) {
      const std::size_t task = next_++;
      lock.unlock();
      std::exception_ptr failure = nullptr;
      try {
        fn_(task, worker);  // fn_ is not replaced before every task of the batch is finished
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure && !failure_) {
        failure_ = failure;
      }
      if (++finished_ == tasks_) {
        done_cv_.notify_all();
      }
    }
  }
}

std::exception_ptr wait_all(std::map<int, std::unique_ptr<worker_pool>>& pools) noexcept {
  std::exception_ptr failure = nullptr;
  for (auto& [node, pool] : pools) {
    try {
      pool->wait();
    } catch (...) {
      failure = failure ? failure : std::current_exception();
    }
  }
  return failure;
}

}  // namespace tierflow::detail
