#pragma once
/** @file
 * @brief The memory resource interface every tier allocator implements.
 */

#include <cstddef>
#include <string>

namespace tierflow {

/**
 * @brief Allocates and frees memory of one kind (a NUMA-bound tier, pinned host memory, a
 * pool, device memory).
 *
 * Public, non-virtual allocate/deallocate validate their arguments and call the private
 * virtual do_allocate/do_deallocate, so every resource shares one contract:
 * - `allocate(0)` returns nullptr and `deallocate(nullptr, 0)` does nothing;
 * - the result is aligned to `alignment`, a power of two (default: 64 bytes);
 * - failure throws: out_of_capacity when there is no room, tierflow::error for anything else;
 *   a failed allocate leaves the resource as it was;
 * - `deallocate` takes the same bytes and alignment that allocate was given, never throws,
 *   and logs (rather than aborts) on a pointer it does not own where it can tell;
 * - unless a resource says otherwise, it is safe to call from several threads.
 * Host resources return host-accessible pointers; a device resource says where its pointers
 * are valid.
 */
class memory_resource {
 public:
  /** @brief Alignment used when none is given (a cache line). */
  static constexpr std::size_t default_alignment = 64;
  /** @brief Largest alignment accepted (1 GiB). */
  static constexpr std::size_t max_alignment = std::size_t{1} << 30;

  memory_resource() = default;
  memory_resource(const memory_resource&) = delete;
  memory_resource& operator=(const memory_resource&) = delete;
  virtual ~memory_resource() = default;

  /**
   * @brief Allocates @p bytes aligned to @p alignment.
   * @throws tierflow::error for an alignment that is not a power of two or above max_alignment
   * @throws out_of_capacity when the resource has no room
   */
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = default_alignment);

  /** @brief Frees memory from allocate() with the same @p bytes and @p alignment. */
  void deallocate(void* pointer, std::size_t bytes,
                  std::size_t alignment = default_alignment) noexcept;

  /** @brief A short name for messages and metrics (e.g. `numa(bind 0)`, `pool(...)`). */
  [[nodiscard]] virtual std::string name() const = 0;

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void do_deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept = 0;
};

}  // namespace tierflow
