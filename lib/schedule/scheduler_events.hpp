#pragma once
// Device-side helpers of the prefetch scheduler: pooled events, the fence events of a
// sequence, and the page spans it registers with the device.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "schedule/scheduler_accounting.hpp"
#include "tierflow/device.hpp"

namespace tierflow::detail {

// Events are made once and reused: the deleter of a handed-out pointer puts it back.
class event_pool {
 public:
  explicit event_pool(device& dev) : device_(dev) {}
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  event_ptr get() {
    std::unique_ptr<event> e;
    if (free_.empty()) {
      e = device_.create_event();
    } else {
      e = std::move(free_.back());
      free_.pop_back();
    }
    return event_ptr(e.release(), [this](event* p) noexcept {
      try {
        free_.emplace_back(p);
      } catch (...) {
        delete p;
      }
    });
  }

 private:
  device& device_;
  std::vector<std::unique_ptr<event>> free_;
};

// The fence events of one sequence (releases or write-backs), in order. Numbers start at 1.
class fence_line {
 public:
  std::uint64_t push(event_ptr e) {
    if (events_.empty()) {
      first_ = last_ + 1;
    }
    events_.push_back(std::move(e));
    return ++last_;
  }
  // The event of @p seq, or null when it has fired (pruned) or never existed.
  event* find(std::uint64_t seq) const {
    if (seq < first_ || seq > last_ || events_.empty()) {
      return nullptr;
    }
    return events_[seq - first_].get();
  }
  void prune() {
    while (!events_.empty() && events_.front()->query()) {
      events_.pop_front();
      ++first_;
    }
  }
  void clear() {
    events_.clear();
    first_ = last_ + 1;
  }
  [[nodiscard]] std::uint64_t last() const noexcept { return last_; }

 private:
  std::deque<event_ptr> events_;
  std::uint64_t first_ = 1;  // seq of events_.front()
  std::uint64_t last_ = 0;   // seq handed out last
};

// Disjoint page spans covering a set of host ranges (registering a page twice fails on CUDA).
std::vector<std::pair<char*, std::size_t>> page_spans(
    std::vector<std::pair<char*, std::size_t>> ranges);

}  // namespace tierflow::detail
