// The small adaptors: statistics, limit and pinned.

#include <cstring>

#include "platform/numa.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/limit_resource.hpp"
#include "tierflow/log.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/statistics_resource.hpp"

namespace tierflow {

namespace platform = detail::platform;

// --- statistics -------------------------------------------------------------------------

void* statistics_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  void* pointer = upstream_.allocate(bytes, alignment);
  bytes_.add(bytes);
  allocations_.add(1);
  return pointer;
}

void statistics_resource::do_deallocate(void* pointer, std::size_t bytes,
                                        std::size_t alignment) noexcept {
  upstream_.deallocate(pointer, bytes, alignment);
  bytes_.sub(bytes);
  allocations_.sub(1);
}

// --- limit ------------------------------------------------------------------------------

limit_resource::limit_resource(memory_resource& upstream, std::uint64_t limit_bytes,
                               std::string label)
    : upstream_(upstream), limit_(limit_bytes), label_(std::move(label)) {}

std::uint64_t limit_resource::available_bytes() const noexcept {
  const auto used = used_.load();
  return used >= limit_ ? 0 : limit_ - used;
}

std::string limit_resource::name() const {
  return "limit(" + (label_.empty() ? std::string() : label_ + ", ") + format_byte_count(limit_) +
         ", " + upstream_.name() + ")";
}

void* limit_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  auto used = used_.load();
  do {
    if (bytes > limit_ || used > limit_ - bytes) {
      throw out_of_capacity(
          label_.empty() ? name() : label_, bytes,
          {{label_.empty() ? name() : label_, used >= limit_ ? 0 : limit_ - used}});
    }
  } while (!used_.compare_exchange_weak(used, used + bytes));
  try {
    return upstream_.allocate(bytes, alignment);
  } catch (...) {
    used_.fetch_sub(bytes);
    throw;
  }
}

void limit_resource::do_deallocate(void* pointer, std::size_t bytes,
                                   std::size_t alignment) noexcept {
  upstream_.deallocate(pointer, bytes, alignment);
  // More than it holds is a caller's size mismatch: wrapping the count would leave the limit
  // full for good, so it is logged and the count stops at 0.
  auto used = used_.load();
  while (!used_.compare_exchange_weak(used, used >= bytes ? used - bytes : 0)) {
  }
  if (used < bytes) {
    detail::log(log_level::error, name() + ": deallocate of " + std::to_string(bytes) +
                                      " bytes, but only " + std::to_string(used) +
                                      " are held (a size that allocate was not given)");
  }
}

// --- pinned -----------------------------------------------------------------------------

namespace {

class mlock_locker final : public page_locker {
 public:
  void lock(void* address, std::size_t bytes) override {
    if (const int code = platform::lock_pages(address, bytes); code != 0) {
      std::string hint;
      if (code == ENOMEM || code == EPERM || code == EAGAIN) {
        hint =
            " (the locked-memory limit is too low: raise it with `ulimit -l` or run with "
            "CAP_IPC_LOCK)";
      }
      throw environment_error("mlock of " + format_byte_count(bytes) + " failed" + hint, "mlock",
                              code);
    }
  }
  void unlock(void* address, std::size_t bytes) noexcept override {
    if (const int code = platform::unlock_pages(address, bytes); code != 0) {
      detail::log(log_level::error,
                  "munlock of " + std::to_string(bytes) + " bytes failed: " + std::strerror(code));
    }
  }
  [[nodiscard]] std::string_view name() const noexcept override { return "mlock"; }
};

std::size_t round_to_pages(std::size_t bytes) {
  return detail::round_up(bytes, platform::page_size());
}

}  // namespace

page_locker& mlock_page_locker() noexcept {
  static mlock_locker instance;
  return instance;
}

pinned_resource::pinned_resource(memory_resource& upstream, page_locker& locker)
    : upstream_(upstream), locker_(locker) {}

std::string pinned_resource::name() const {
  return "pinned(" + std::string(locker_.name()) + ", " + upstream_.name() + ")";
}

void* pinned_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  const auto length = round_to_pages(bytes);
  if (length < bytes) {
    throw out_of_capacity(name(), bytes, {});
  }
  const auto page_alignment = std::max(alignment, platform::page_size());
  void* pointer = upstream_.allocate(length, page_alignment);
  try {
    locker_.lock(pointer, length);
  } catch (...) {
    upstream_.deallocate(pointer, length, page_alignment);
    throw;
  }
  pinned_.add(length);
  return pointer;
}

void pinned_resource::do_deallocate(void* pointer, std::size_t bytes,
                                    std::size_t alignment) noexcept {
  const auto length = round_to_pages(bytes);
  locker_.unlock(pointer, length);
  upstream_.deallocate(pointer, length, std::max(alignment, platform::page_size()));
  pinned_.sub(length);
}

}  // namespace tierflow
