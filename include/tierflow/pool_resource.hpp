#pragma once
/** @file
 * @brief A coalescing pool over an upstream resource.
 */

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tierflow/memory_resource.hpp"

namespace tierflow {

/** @brief How a pool_resource grows. */
struct pool_options {
  /** @brief The upstream allocation that small requests share (never a power-of-two
   * rounding of anything). */
  std::size_t chunk_bytes = std::size_t{64} << 20;
  /** @brief Most bytes the pool may take from upstream in all; 0: no cap. */
  std::uint64_t max_bytes = 0;
  /** @brief A request of at least this size that finds no free block gets an upstream chunk
   * of exactly its size (page-rounded). 0: chunk_bytes / 20, so a shared chunk strands less
   * than 5% of itself and the pool holds at most 1.05 x the bytes in use + one chunk. */
  std::size_t dedicated_bytes = 0;
};

/**
 * @brief Serves allocations from chunks taken from its upstream and kept: freed blocks go to a
 * free list (best fit, coalesced with their free neighbours in the same chunk) and are reused.
 * Chunks go back upstream when the pool is destroyed or on release_unused().
 *
 * Blocks are multiples of 256 bytes. Requests of `dedicated_bytes` or more that find no free
 * block get a chunk of their own size; smaller ones share chunks of `chunk_bytes`. Thread-safe (one
 * mutex). Does not own the upstream, which must outlive it. Over a pinned_resource it is the
 * register-once pinned pool.
 */
class pool_resource final : public memory_resource {
 public:
  /** @throws tierflow::error when chunk_bytes is 0 */
  explicit pool_resource(memory_resource& upstream, pool_options options = {});
  ~pool_resource() override;

  /**
   * @brief Takes @p bytes from upstream now, as chunks allocated by @p threads threads at
   * once (locking or first-touching them in parallel), so later allocations do not wait.
   * @throws out_of_capacity, before anything is taken, when @p bytes (rounded up to whole
   *         chunks) pass max_bytes or cannot be counted in 64 bits; what the upstream throws,
   *         and then the chunks taken before the failure stay in the pool
   */
  void reserve(std::uint64_t bytes, unsigned threads = 1);

  /** @brief Gives every chunk with nothing allocated back to upstream. */
  void release_unused() noexcept;

  /** @brief Bytes taken from upstream and held now. */
  [[nodiscard]] std::uint64_t upstream_bytes() const;
  /** @brief Bytes handed out and not yet freed. */
  [[nodiscard]] std::uint64_t allocated_bytes() const;
  [[nodiscard]] std::string name() const override { return "pool(" + upstream_.name() + ")"; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept override;

  struct chunk {
    char* base = nullptr;
    std::size_t bytes = 0;
    std::size_t in_use = 0;  // blocks allocated from it
  };
  struct block {
    std::size_t bytes = 0;
    std::size_t chunk_index = 0;
  };
  void* take_from_free_list(std::size_t bytes, std::size_t alignment);
  void add_free(char* address, std::size_t bytes, std::size_t chunk_index);
  void remove_free(std::map<char*, block>::iterator it);
  void add_chunk(char* base, std::size_t bytes);
  void grow(std::size_t chunk_size, std::size_t requested);

  memory_resource& upstream_;
  pool_options options_;
  mutable std::mutex mutex_;
  std::vector<chunk> chunks_;  // a released chunk keeps its slot with base == nullptr
  std::map<char*, block> free_by_address_;
  std::multimap<std::size_t, char*> free_by_size_;
  // pointer handed out -> its block (the block starts at the pointer: any alignment head went
  // back to the free list)
  struct allocation {
    std::size_t bytes = 0;
    std::size_t chunk_index = 0;
  };
  std::unordered_map<char*, allocation> allocated_;
  std::uint64_t upstream_bytes_ = 0;
  std::uint64_t growing_bytes_ = 0;  // chunks being allocated upstream right now
  std::uint64_t allocated_bytes_ = 0;
};

}  // namespace tierflow
