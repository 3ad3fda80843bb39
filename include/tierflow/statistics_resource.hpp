#pragma once
/** @file
 * @brief An adaptor that counts what passes through it.
 */

#include <string>

#include "tierflow/memory_resource.hpp"
#include "tierflow/metrics.hpp"

namespace tierflow {

/**
 * @brief Counts bytes and allocations `{current, peak, total}` over an upstream resource.
 *
 * Does not own the upstream, which must outlive it. Thread-safe. A failed upstream allocate
 * leaves the counters as they were.
 */
class statistics_resource final : public memory_resource {
 public:
  explicit statistics_resource(memory_resource& upstream) : upstream_(upstream) {}

  /** @brief Bytes held through this adaptor. */
  [[nodiscard]] metrics::usage bytes() const noexcept { return bytes_.read(); }
  /** @brief Allocations held through this adaptor. */
  [[nodiscard]] metrics::usage allocations() const noexcept { return allocations_.read(); }
  [[nodiscard]] memory_resource& upstream() const noexcept { return upstream_; }
  [[nodiscard]] std::string name() const override { return "statistics(" + upstream_.name() + ")"; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept override;

  memory_resource& upstream_;
  metrics::usage_counter bytes_;
  metrics::usage_counter allocations_;
};

}  // namespace tierflow
