#pragma once
/** @file
 * @brief Page-locked (pinned) host memory for DMA, and the page-locking interface a device
 * backend plugs into.
 */

#include <cstddef>
#include <string>
#include <string_view>

#include "tierflow/memory_resource.hpp"
#include "tierflow/metrics.hpp"

namespace tierflow {

/**
 * @brief Page-locks host memory so devices can DMA to and from it. The default uses mlock;
 * the CUDA backend supplies one that calls cudaHostRegister / cudaHostUnregister, so memory
 * already placed by mbind (DRAM or CXL) becomes DMA-able without this layer knowing CUDA.
 */
class page_locker {
 public:
  virtual ~page_locker() = default;
  /** @brief Locks [@p address, @p address + @p bytes). @throws tierflow::error with context */
  virtual void lock(void* address, std::size_t bytes) = 0;
  /** @brief Unlocks what lock() locked; logs failures, never throws. */
  virtual void unlock(void* address, std::size_t bytes) noexcept = 0;
  /** @brief e.g. `mlock`, `cudaHostRegister`. */
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
};

/** @brief The mlock/munlock locker (stateless; a process-wide instance). */
[[nodiscard]] page_locker& mlock_page_locker() noexcept;

/**
 * @brief Locks every allocation of its upstream with a page_locker, and unlocks it before
 * giving it back. Each allocate pays for locking: put a pool_resource on top to lock once and
 * reuse (`pool_resource pool(pinned)`).
 *
 * Does not own the upstream or the locker, which must outlive it. Thread-safe when they are.
 * Allocations are whole pages of the upstream (request rounded up to the page size).
 */
class pinned_resource final : public memory_resource {
 public:
  explicit pinned_resource(memory_resource& upstream, page_locker& locker = mlock_page_locker());

  /** @brief Bytes locked now / at most / in all. */
  [[nodiscard]] metrics::usage pinned_bytes() const noexcept { return pinned_.read(); }
  [[nodiscard]] page_locker& locker() const noexcept { return locker_; }
  [[nodiscard]] std::string name() const override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept override;

  memory_resource& upstream_;
  page_locker& locker_;
  metrics::usage_counter pinned_;
};

}  // namespace tierflow
