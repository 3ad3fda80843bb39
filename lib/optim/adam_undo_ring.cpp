#include "optim/adam_undo_ring.hpp"

#include <algorithm>

namespace tierflow::detail {

hbm_undo_ring::~hbm_undo_ring() {
  if (hbm_ != nullptr) {
    core_.dev.memory().deallocate(hbm_, bytes_);
  }
}

state_piece_list chunk_pieces(const param_state& p, const chunk_ref& c) {
  state_piece_list out;
  out.items[0] = {reinterpret_cast<unsigned char*>(p.master_p() + c.offset), 0,
                  c.count * sizeof(float)};
  std::size_t at = out.items[0].bytes;
  out.count = 1;
  for (const state_piece& piece : state_pieces(p.moments_at, p.desc.elements, c.offset, c.count)) {
    out.items[out.count++] = {piece.at, at, piece.bytes};
    at += piece.bytes;
  }
  return out;
}

void hbm_undo_ring::allocate(std::size_t slots) {
  for (const auto& c : core_.chunks) {
    const param_state& p = core_.param_of(c);
    const std::size_t bytes =
        c.count * sizeof(float) + packed_moments_bytes(p.state_dtype(), c.count);
    slot_bytes_ = std::max(slot_bytes_, bytes);
  }
  bytes_ = slots * slot_bytes_;
  hbm_ = core_.dev.memory().allocate(bytes_);
  core_.totals.hbm_undo_bytes = bytes_;
  for (std::size_t i = 0; i < slots; ++i) {
    events_.push_back(core_.dev.create_event());
  }
  chunk_.assign(slots, core_.chunks.size());
}

void hbm_undo_ring::clear() {
  std::fill(chunk_.begin(), chunk_.end(), core_.chunks.size());
}

// Enqueues the snapshot of chunk @p c's staged pre-step state (@p master, @p m, @p v in HBM)
// into its undo slot on @p on, the stream its kernel runs on: ordered after the fetch and
// before the kernel without a host wait. The caller made sure the slot is free.
void hbm_undo_ring::save(const chunk_ref& c, stream& on, const state_piece_list& pieces) {
  const std::size_t index = c.index % chunk_.size();
  unsigned char* out = slot(index);
  for (const state_piece& piece : pieces) {
    core_.dev.copy_async(out + piece.packed_offset, piece.at, piece.bytes, copy_kind::d2d, on);
  }
  on.record(*events_[index]);
  chunk_[index] = c.index;
}

// Those whose snapshot ran have their pre-step state in the ring (a slot is reused only after
// its chunk's write-back landed); a snapshot that did not run (its event failed) means the
// stream had failed before it, so the chunk's kernel and write-back, ordered after it, did
// not run either.
std::vector<std::pair<std::size_t, std::size_t>> hbm_undo_ring::restorable(
    const std::vector<char>& done) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t index = 0; index < chunk_.size(); ++index) {
    const std::size_t chunk = chunk_[index];
    if (chunk >= core_.chunks.size() || done[chunk] != 0) {
      continue;
    }
    try {
      events_[index]->synchronize();
      out.emplace_back(chunk, index);
    } catch (const device_error&) {
    }
  }
  return out;
}

bool hbm_undo_ring::restore(const std::vector<std::pair<std::size_t, std::size_t>>& restore,
                            std::string& failure) {
  if (restore.empty()) {
    return true;
  }
  stream& d2h = core_.dev.d2h_stream();
  try {
    for (const auto& [index, at] : restore) {
      const chunk_ref& c = core_.chunks[index];
      const unsigned char* in = slot(at);
      for (const state_piece& piece : chunk_pieces(core_.param_of(c), c)) {
        core_.dev.copy_async(piece.at, in + piece.packed_offset, piece.bytes, copy_kind::d2h, d2h);
      }
    }
    d2h.synchronize();
  } catch (const device_error& e) {
    failure = e.what();
    core_.settle_device();
    return false;
  }
  return true;
}

}  // namespace tierflow::detail
