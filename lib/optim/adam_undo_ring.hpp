#pragma once
// streamed mode's undo ring (private to lib/optim), in HBM beside the scheduler's staging
// budget (one allocation): each slot holds one chunk's pre-step master, m and v (3 × largest
// chunk floats), copied from its staging on the compute stream before its kernel; an event
// per slot is recorded after the copies (docs/reliability.md, streamed mode).
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/adam_core.hpp"

namespace tierflow::detail {

class hbm_undo_ring {
 public:
  explicit hbm_undo_ring(adam_core& core) : core_(core) {}
  ~hbm_undo_ring();
  hbm_undo_ring(const hbm_undo_ring&) = delete;
  hbm_undo_ring& operator=(const hbm_undo_ring&) = delete;

  /** Allocates @p slots slots for the largest chunk and an event each. */
  void allocate(std::size_t slots);
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

  /** Empties every slot (a new step). */
  void clear();
  /** The chunk whose pre-step copy sits in chunk @p index's slot (none: chunks.size()). */
  [[nodiscard]] std::size_t previous(std::size_t index) const {
    return chunk_[index % chunk_.size()];
  }
  /** Enqueues the snapshot of chunk @p c's staged state into its slot (see the .cpp). */
  void save(const chunk_ref& c, stream& on, const float* master, const float* m, const float* v);
  /** (chunk, slot) of each chunk not in @p done whose snapshot ran (its event fired). */
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> restorable(
      const std::vector<char>& done) const;
  /** Copies each (chunk, slot) of @p restore back to the chunk's tier copy (D2H, the device
   *  idle); false (with the reason) when a copy fails, the slots intact. */
  bool restore(const std::vector<std::pair<std::size_t, std::size_t>>& restore,
               std::string& failure);

 private:
  [[nodiscard]] float* slot(std::size_t slot) const {
    return static_cast<float*>(hbm_) + slot * 3 * largest_chunk_;
  }

  adam_core& core_;
  void* hbm_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t largest_chunk_ = 0;
  std::vector<std::unique_ptr<event>> events_;
  std::vector<std::size_t> chunk_;  // the chunk in each slot this step (none: chunks.size())
};

}  // namespace tierflow::detail
