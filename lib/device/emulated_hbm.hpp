#pragma once
// The emulated device's HBM (private to lib/device): page-granular anonymous mappings up to a
// capacity, with injected allocation failures, and the blocks it handed out (so that a bad
// deallocate is logged and changes nothing, and is_device_memory() can answer).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "platform/numa.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"
#include "tierflow/memory_resource.hpp"

namespace tierflow::detail {

class emulated_hbm final : public memory_resource {
 public:
  explicit emulated_hbm(std::uint64_t capacity) : capacity_(capacity) {}
  std::string name() const override { return "emulated hbm"; }
  std::uint64_t used() const noexcept { return used_.load(); }
  std::uint64_t capacity() const noexcept { return capacity_; }
  void fail_allocation(unsigned k) { fail_countdown_.store(k); }
  // Whether @p p lies inside a block it handed out.
  bool contains(const void* p) const noexcept {
    const std::lock_guard lock(blocks_mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) {
      return false;
    }
    --it;
    const auto* start = static_cast<const unsigned char*>(it->first);
    return static_cast<const unsigned char*>(p) < start + it->second;
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    auto left = fail_countdown_.load();
    while (left > 0 && !fail_countdown_.compare_exchange_weak(left, left - 1)) {
    }
    const std::uint64_t length = round(bytes);
    if (left == 1) {
      throw out_of_capacity("emulated hbm (injected failure)", bytes,
                            {{"hbm", capacity_ - std::min(capacity_, used_.load())}});
    }
    auto used = used_.load();
    do {
      if (length < bytes || length > capacity_ || used > capacity_ - length) {
        throw out_of_capacity("emulated hbm", bytes,
                              {{"hbm", capacity_ - std::min(capacity_, used)}});
      }
    } while (!used_.compare_exchange_weak(used, used + length));
    void* p = nullptr;
    if (const int code = platform::map_anonymous(length, std::max<std::size_t>(alignment, 4096), p);
        code != 0) {
      used_.fetch_sub(length);
      throw out_of_capacity("emulated hbm (host mmap failed)", bytes, {{"hbm", 0}});
    }
    try {
      const std::lock_guard lock(blocks_mutex_);
      blocks_.emplace(p, bytes);
    } catch (...) {
      platform::unmap(p, length);
      used_.fetch_sub(length);
      throw;
    }
    return p;
  }
  // As CUDA's cudaFree and pool_resource: a pointer it did not hand out (freed already, host
  // memory, inside a block) is logged and changes nothing (unmapping it would take a neighbour's
  // pages, and the count of used bytes would wrap: "free: 0 B" for good); a wrong size is logged
  // and the block is freed as allocated.
  void do_deallocate(void* p, std::size_t bytes, std::size_t) noexcept override {
    std::size_t allocated = 0;
    {
      const std::lock_guard lock(blocks_mutex_);
      const auto it = blocks_.find(p);
      if (it == blocks_.end()) {
        detail::log(log_level::error, name() + ": deallocate of a pointer it did not hand out");
        return;
      }
      allocated = it->second;
      blocks_.erase(it);
    }
    if (bytes != allocated) {
      detail::log(log_level::error, name() + ": deallocate with " + std::to_string(bytes) +
                                        " bytes for an allocation of " + std::to_string(allocated));
    }
    platform::unmap(p, round(allocated));
    used_.fetch_sub(round(allocated));
  }
  static std::uint64_t round(std::size_t bytes) { return detail::round_up(bytes, 4096); }
  std::uint64_t capacity_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<unsigned> fail_countdown_{0};
  mutable std::mutex blocks_mutex_;
  std::map<const void*, std::size_t> blocks_;  // what do_allocate handed out: bytes asked
};

}  // namespace tierflow::detail
