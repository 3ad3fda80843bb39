#include "schedule/staging_policy.hpp"

#include <algorithm>

namespace tierflow::detail {

staging_policy::staging_policy(staging_device& device, window_unit unit)
    : device_(device), unit_(unit) {}

void staging_policy::set_arena(std::uint64_t capacity, std::uint64_t alignment) {
  arena_ = staging_arena(capacity, alignment);
}

bool staging_policy::try_stage(std::uint64_t seq) {
  const auto& info = steps_[static_cast<std::size_t>(seq % steps_.size())];
  std::vector<buffer_id> fetched;
  std::vector<std::uint64_t> sizes;
  for (const auto id : info.staged) {
    if (!buffers_[id].staged) {
      fetched.push_back(id);
      sizes.push_back(buffers_[id].aligned);
    }
  }
  std::vector<std::uint64_t> offsets;
  fence after;
  if (!arena_.allocate_all(sizes, offsets, after)) {
    return false;
  }
  for (const auto id : info.staged) {
    ++buffers_[id].holders;
  }
  for (std::size_t i = 0; i < fetched.size(); ++i) {
    auto& b = buffers_[fetched[i]];
    b.staged = true;
    b.offset = offsets[i];
    b.fetched_by = seq;
    b.dirty = false;
    after.merge({0, b.last_writeback});
    used_.add(b.aligned);
  }
  device_.stage(seq, fetched, after);
  staged_.push_back(seq);
  return true;
}

void staging_policy::pump() {
  if (!has_position_) {
    return;
  }
  const auto n = steps_.size();
  std::uint64_t bytes_ahead = 0;  // window in bytes: what the steps staged ahead hold
  if (unit_ == window_unit::bytes) {
    for (const auto seq : staged_) {
      bytes_ahead += seq >= position_ + (acquired_ ? 1 : 0) ? steps_[seq % n].staged_bytes : 0;
    }
  }
  while (ahead() < n) {
    const auto next = staged_.empty() ? position_ : staged_.back() + 1;
    if (!wrap_ && next >= iteration_end_) {
      return;  // the next iteration is staged from its first acquire on
    }
    const auto next_bytes = steps_[next % n].staged_bytes;
    if (unit_ == window_unit::steps ? ahead() >= window_ : bytes_ahead + next_bytes > window_) {
      return;
    }
    if (!try_stage(next)) {
      ++budget_misses_;
      return;
    }
    bytes_ahead += next_bytes;
  }
}

bool staging_policy::acquire(std::size_t step) {
  const auto n = steps_.size();
  if (!has_position_) {
    position_ = position_ / n * n + step;
    has_position_ = true;
  }
  iteration_end_ = (position_ / n + 1) * n;
  if (staged_.empty() && !try_stage(position_)) {
    return false;
  }
  device_.launch();
  acquired_ = true;
  pump();
  return true;
}

void staging_policy::unstage(staging_buffer& b) {
  b.staged = false;
  used_.sub(b.aligned);
}

std::vector<buffer_id> staging_policy::release(bool dirty) {
  const auto step = static_cast<std::size_t>(position_ % steps_.size());
  staged_.pop_front();
  acquired_ = false;
  ++position_;
  const auto release_seq = device_.complete(dirty);
  const auto& info = steps_[step];
  std::vector<buffer_id> write_back;
  for (const auto id : info.staged) {
    auto& b = buffers_[id];
    if (dirty && std::binary_search(info.writes.begin(), info.writes.end(), id)) {
      b.dirty = true;
    }
    if (--b.holders == 0) {
      if (b.dirty) {
        write_back.push_back(id);
      } else {
        arena_.free(b.offset, b.aligned, {release_seq, 0});
        unstage(b);
      }
    }
  }
  if (!write_back.empty()) {
    const auto written = device_.write_back(write_back);  // one fence for the batch
    for (const auto id : write_back) {
      auto& b = buffers_[id];
      b.last_writeback = written;
      arena_.free(b.offset, b.aligned, {release_seq, written});
      b.dirty = false;
      unstage(b);
    }
  }
  return write_back;
}

std::uint64_t staging_policy::drop_staged() {
  staged_.clear();
  arena_.reset();
  std::uint64_t unused = 0;
  for (auto& b : buffers_) {
    if (b.staged) {
      // Fetched for a run after the last one acquired (the position, with none acquired).
      unused += b.fetched_by >= position_ + (acquired_ ? 1 : 0) ? b.bytes : 0;
      unstage(b);
    }
    b.holders = 0;
    b.dirty = false;
  }
  return unused;
}

void staging_policy::restart_after_failure() {
  acquired_ = false;
  forget_position();
}

void staging_policy::forget_position() {
  has_position_ = false;
  position_ = (position_ / steps_.size() + 1) * steps_.size();
}

}  // namespace tierflow::detail
