#pragma once
// streamed mode's undo ring (private to lib/optim), in HBM beside the scheduler's staging
// budget (one allocation): each slot holds one chunk's pre-step master and moments as stored
// (fp32: 3 × its floats; compressed: the master, then m, v and their scales as stored), copied
// from its staging on the compute stream before its kernel; an event per slot is recorded after
// the copies (docs/reliability.md, streamed mode).
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/adam_core.hpp"

namespace tierflow::detail {

/** Chunk @p c's master and moments where @p p keeps them (the tier copy), each piece's bytes
 *  and place in a packed copy of the chunk: the master, then state_pieces' order. */
state_piece_list chunk_pieces(const param_state& p, const chunk_ref& c);

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
  /** Enqueues the snapshot of chunk @p c's staged state into its slot (see the .cpp):
   *  @p pieces its master and moments in HBM, in chunk_pieces' order. */
  void save(const chunk_ref& c, stream& on, const state_piece_list& pieces);
  /** (chunk, slot) of each chunk not in @p done whose snapshot ran (its event fired). */
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> restorable(
      const std::vector<char>& done) const;
  /** Copies each (chunk, slot) of @p restore back to the chunk's tier copy (D2H, the device
   *  idle); false (with the reason) when a copy fails, the slots intact. */
  bool restore(const std::vector<std::pair<std::size_t, std::size_t>>& restore,
               std::string& failure);

 private:
  [[nodiscard]] unsigned char* slot(std::size_t slot) const {
    return static_cast<unsigned char*>(hbm_) + slot * slot_bytes_;
  }

  adam_core& core_;
  void* hbm_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t slot_bytes_ = 0;  // the largest chunk's master and moments
  std::vector<std::unique_ptr<event>> events_;
  std::vector<std::size_t> chunk_;  // the chunk in each slot this step (none: chunks.size())
};

}  // namespace tierflow::detail
