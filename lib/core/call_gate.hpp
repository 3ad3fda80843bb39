#pragma once
// One call at a time on an object, checked: a second thread's call is refused at once with
// busy_error instead of racing the first (a deadlock or a crash), and changes nothing.

#include <atomic>
#include <string>

#include "tierflow/error.hpp"

namespace tierflow::detail {

/**
 * @brief Admits either one exclusive call, or any number of shared calls, at a time; a call
 * that does not fit is refused (never waited for). Lock-free; noexcept except the refusal.
 *
 * Shared calls are those that are safe with each other but not with the exclusive ones
 * (offload_adam::grad_ready from a framework's autograd threads).
 */
class call_gate {
 public:
  /** @brief Holds the gate exclusively until destroyed. */
  class exclusive {
   public:
    /** @throws busy_error naming @p call when any call holds the gate */
    exclusive(call_gate& gate, const char* call) : gate_(gate) {
      int idle = 0;
      if (!gate_.state_.compare_exchange_strong(idle, held_exclusively, std::memory_order_acquire,
                                                std::memory_order_relaxed)) {
        gate_.refuse(call);
      }
      gate_.holder_.store(call, std::memory_order_relaxed);
    }
    ~exclusive() {
      gate_.holder_.store(nullptr, std::memory_order_relaxed);
      gate_.state_.store(0, std::memory_order_release);
    }
    exclusive(const exclusive&) = delete;
    exclusive& operator=(const exclusive&) = delete;

   private:
    call_gate& gate_;
  };

  /** @brief Holds the gate shared (with other shared holders) until destroyed. */
  class shared {
   public:
    /** @throws busy_error naming @p call when an exclusive call holds the gate */
    shared(call_gate& gate, const char* call) : gate_(gate) {
      int count = gate_.state_.load(std::memory_order_relaxed);
      do {
        if (count == held_exclusively) {
          gate_.refuse(call);
        }
      } while (!gate_.state_.compare_exchange_weak(count, count + 1, std::memory_order_acquire,
                                                   std::memory_order_relaxed));
      gate_.holder_.store(call, std::memory_order_relaxed);
    }
    ~shared() { gate_.state_.fetch_sub(1, std::memory_order_release); }
    shared(const shared&) = delete;
    shared& operator=(const shared&) = delete;

   private:
    call_gate& gate_;
  };

 private:
  static constexpr int held_exclusively = -1;

  [[noreturn]] void refuse(const char* call) const {
    const char* running = holder_.load(std::memory_order_relaxed);
    throw busy_error(call, running != nullptr ? running : "");
  }

  std::atomic<int> state_{0};  // 0: idle; -1: one exclusive call; N > 0: N shared calls
  // The call that last entered (a string literal, or null), for the refusal's message only:
  // it may lag the state by a moment.
  std::atomic<const char*> holder_{nullptr};
};

}  // namespace tierflow::detail
