#include "schedule/staging_arena.hpp"

#include <algorithm>

#include "tierflow/error.hpp"

namespace tierflow::detail {

void fence::merge(const fence& other) noexcept {
  compute = std::max(compute, other.compute);
  writeback = std::max(writeback, other.writeback);
}

staging_arena::staging_arena(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(capacity - capacity % alignment), alignment_(alignment) {
  TIERFLOW_EXPECTS(alignment > 0 && (alignment & (alignment - 1)) == 0,
                   "staging_arena: alignment must be a power of two");
  reset();
}

std::uint64_t staging_arena::aligned(std::uint64_t bytes) const noexcept {
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

void staging_arena::reset() {
  free_.clear();
  used_ = 0;
  if (capacity_ > 0) {
    free_.push_back({0, capacity_, {}});
  }
}

bool staging_arena::take(std::uint64_t size, std::uint64_t& offset, fence& after) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->size >= size && (best == free_.end() || it->size < best->size)) {
      best = it;
    }
  }
  if (best == free_.end()) {
    return false;
  }
  offset = best->offset;
  after.merge(best->f);
  if (best->size == size) {
    free_.erase(best);
  } else {
    best->offset += size;
    best->size -= size;
  }
  used_ += size;
  return true;
}

bool staging_arena::allocate_all(const std::vector<std::uint64_t>& sizes,
                                 std::vector<std::uint64_t>& offsets, fence& after) {
  const auto saved_free = free_;
  const auto saved_used = used_;
  fence merged = after;
  offsets.resize(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (!take(aligned(sizes[i]), offsets[i], merged)) {
      free_ = saved_free;
      used_ = saved_used;
      return false;
    }
  }
  after = merged;
  return true;
}

void staging_arena::free(std::uint64_t offset, std::uint64_t bytes, fence f) {
  const auto size = aligned(bytes);
  TIERFLOW_EXPECTS(offset + size <= capacity_ && size <= used_,
                   "staging_arena: freeing a range it did not hand out");
  auto next = std::lower_bound(free_.begin(), free_.end(), offset,
                               [](const range& r, std::uint64_t o) { return r.offset < o; });
  TIERFLOW_EXPECTS(next == free_.end() || next->offset >= offset + size,
                   "staging_arena: freeing a range that is already free");
  used_ -= size;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    TIERFLOW_EXPECTS(prev->offset + prev->size <= offset,
                     "staging_arena: freeing a range that is already free");
    if (prev->offset + prev->size == offset) {
      prev->size += size;
      prev->f.merge(f);
      if (next != free_.end() && prev->offset + prev->size == next->offset) {
        prev->size += next->size;
        prev->f.merge(next->f);
        free_.erase(next);
      }
      return;
    }
  }
  if (next != free_.end() && offset + size == next->offset) {
    next->offset = offset;
    next->size += size;
    next->f.merge(f);
    return;
  }
  free_.insert(next, range{offset, size, f});
}

}  // namespace tierflow::detail
