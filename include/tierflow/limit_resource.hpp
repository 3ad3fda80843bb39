#pragma once
/** @file
 * @brief An adaptor that caps how much an upstream resource may hand out.
 */

#include <atomic>
#include <cstdint>
#include <string>

#include "tierflow/memory_resource.hpp"

namespace tierflow {

/**
 * @brief Caps the bytes held through it at a limit: a small tier for tests, or memory kept
 * back for others. An allocation that would pass the limit throws out_of_capacity (naming
 * this resource, the bytes asked and the bytes left) without calling upstream.
 *
 * Does not own the upstream, which must outlive it. Thread-safe; when the upstream throws,
 * the bytes it had reserved are given back. A deallocate of more bytes than it holds (a size
 * mismatch) is logged and brings the count to 0 rather than wrapping it.
 */
class limit_resource final : public memory_resource {
 public:
  /** @param label names the capped thing in errors, e.g. a tier name */
  limit_resource(memory_resource& upstream, std::uint64_t limit_bytes, std::string label = {});

  [[nodiscard]] std::uint64_t limit_bytes() const noexcept { return limit_; }
  [[nodiscard]] std::uint64_t used_bytes() const noexcept { return used_.load(); }
  [[nodiscard]] std::uint64_t available_bytes() const noexcept;
  [[nodiscard]] std::string name() const override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept override;

  memory_resource& upstream_;
  std::uint64_t limit_;
  std::string label_;
  std::atomic<std::uint64_t> used_{0};
};

}  // namespace tierflow
