#pragma once
/** @file
 * @brief Host memory bound to NUMA nodes with mmap + mbind.
 */

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "tierflow/memory_resource.hpp"
#include "tierflow/topology.hpp"

namespace tierflow {

/** @brief How pages are spread over the resource's nodes. */
enum class numa_policy {
  bind,                 ///< only these nodes (MPOL_BIND)
  preferred,            ///< these nodes first, others when full (MPOL_PREFERRED[_MANY])
  interleave,           ///< page by page, round robin (MPOL_INTERLEAVE)
  weighted_interleave,  ///< in proportion to weights (MPOL_WEIGHTED_INTERLEAVE, or a split)
};

/** @brief The stable name of a policy (`bind`, `preferred`, ...). */
[[nodiscard]] std::string_view to_string(numa_policy policy) noexcept;

/** @brief What a numa_resource allocates. */
struct numa_resource_options {
  /** @brief Target nodes (at least one, no duplicates). */
  std::vector<numa_node_id> nodes;
  numa_policy policy = numa_policy::bind;
  /**
   * @brief weighted_interleave only: one weight (> 0) per node. Empty: the kernel's weights
   * (/sys/kernel/mm/mempolicy/weighted_interleave). Weights the kernel does not hold are
   * honoured with a user-space split: contiguous ranges bound to single nodes in proportion.
   */
  std::vector<unsigned> weights;
  /** @brief madvise(MADV_HUGEPAGE) and 2 MiB alignment for allocations of 2 MiB or more. */
  bool huge_pages = true;
  /** @brief Fault every page in during allocate, from threads running on the target nodes. */
  bool populate = false;
  /** @brief Threads that populate; 0: one per available CPU. */
  unsigned populate_threads = 0;
};

/**
 * @brief A memory resource that maps anonymous memory and binds it to NUMA nodes.
 *
 * Each allocation is its own mapping (rounded up to whole pages), placed by the policy when
 * first touched, or at allocate when `populate` is set. Memory is not zeroed beyond what the
 * kernel does (fresh pages read as zero). Thread-safe. Capacity is not checked here: cap it
 * with limit_resource or the placement policy. Where the pages really are: where().
 */
class numa_resource final : public memory_resource {
 public:
  /** @throws tierflow::error on an empty or invalid node set, or bad weights */
  explicit numa_resource(numa_resource_options options);

  /** @brief The options it was made with. */
  [[nodiscard]] const numa_resource_options& options() const noexcept { return options_; }

  /** @brief How the policy was carried out so far, e.g. `weighted_interleave (kernel)` or
   * `weighted_interleave (user-space split)`. */
  [[nodiscard]] std::string effective_policy() const;

  [[nodiscard]] std::string name() const override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept override;

  struct segment {
    std::size_t offset = 0;
    std::size_t bytes = 0;
    int node = -1;  // -1: any (interleaved)
  };
  std::vector<segment> place(void* address, std::size_t bytes);
  std::vector<segment> split_by_weights(void* address, std::size_t bytes,
                                        const std::vector<unsigned>& weights);
  void populate(void* address, const std::vector<segment>& segments) const;
  [[nodiscard]] std::size_t mapping_bytes(std::size_t bytes) const noexcept;

  numa_resource_options options_;
  std::vector<int> node_ids_;
  std::atomic<bool> kernel_weighted_refused_{false};
  mutable std::mutex policy_mutex_;
  std::string effective_policy_;
};

}  // namespace tierflow
