#pragma once
// HBM staging slots of the prefetch scheduler: offsets in one device allocation, handed out
// best fit, with the device-side fence each freed range carries until it is reused.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tierflow::detail {

/** What reusing a range must wait for: the release (compute done) and the write-back (D2H
 *  done) that freed it, as sequence numbers of the scheduler's fence events; 0 = nothing. Both
 *  sequences are each totally ordered on one stream, so the larger number covers the smaller. */
struct fence {
  std::uint64_t compute = 0;
  std::uint64_t writeback = 0;
  void merge(const fence& other) noexcept;
};

/** Best-fit allocator of [0, capacity) in multiples of an alignment, with coalescing free
 *  ranges. Not thread-safe. */
class staging_arena {
 public:
  staging_arena(std::uint64_t capacity, std::uint64_t alignment);

  /** @p bytes rounded up to the alignment. */
  [[nodiscard]] std::uint64_t aligned(std::uint64_t bytes) const noexcept;
  /** Places every size of @p sizes or none (all-or-nothing). On success, @p offsets holds
   *  their offsets and @p after the merged fence of every range they were carved from. */
  bool allocate_all(const std::vector<std::uint64_t>& sizes, std::vector<std::uint64_t>& offsets,
                    fence& after);
  /** Gives back [offset, offset + aligned(bytes)); its next user waits for @p f. */
  void free(std::uint64_t offset, std::uint64_t bytes, fence f);
  /** Everything free and unfenced (the device is idle). */
  void reset();

  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t used() const noexcept { return used_; }
  /** Free ranges (for tests of coalescing). */
  [[nodiscard]] std::size_t free_ranges() const noexcept { return free_.size(); }

 private:
  struct range {
    std::uint64_t offset;
    std::uint64_t size;
    fence f;
  };
  bool take(std::uint64_t size, std::uint64_t& offset, fence& after);
  std::uint64_t capacity_;
  std::uint64_t alignment_;
  std::uint64_t used_ = 0;
  std::vector<range> free_;  // sorted by offset, never adjacent
};

}  // namespace tierflow::detail
