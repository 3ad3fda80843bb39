#include "tierflow/transfer_engine.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

namespace {

// Waits for a bounce buffer's last DMA from an earlier transfer. Its failure was that
// transfer's to report, not this one's.
void settle(event& e) {
  try {
    e.synchronize();
  } catch (const std::exception& ex) {
    detail::log(log_level::debug, std::string("transfer_engine: earlier transfer: ") + ex.what());
  }
}

}  // namespace

std::string_view to_string(memory_space space) noexcept {
  switch (space) {
    case memory_space::host:
      return "host";
    case memory_space::host_pinned:
      return "host_pinned";
    case memory_space::device:
      return "device";
  }
  return "unknown";
}

struct transfer_engine::pending {
  std::string link;
  std::size_t bytes = 0;
  std::unique_ptr<event> start;
  std::unique_ptr<event> end;
};

transfer_engine::transfer_engine(device& dev, transfer_options options)
    : device_(dev), options_(options) {
  TIERFLOW_EXPECTS(options_.chunk_bytes > 0, "transfer_engine: chunk_bytes must be above 0");
  TIERFLOW_EXPECTS(options_.chunks_in_flight > 0,
                   "transfer_engine: chunks_in_flight must be at least 1");
  using ms = memory_space;
  register_route(ms::host_pinned, ms::device,
                 [this](void* d, const void* s, std::size_t n, event& done) {
                   chunked(d, s, n, copy_kind::h2d, device_.h2d_stream(), done);
                 });
  register_route(ms::device, ms::host_pinned,
                 [this](void* d, const void* s, std::size_t n, event& done) {
                   chunked(d, s, n, copy_kind::d2h, device_.d2h_stream(), done);
                 });
  register_route(ms::device, ms::device,
                 [this](void* d, const void* s, std::size_t n, event& done) {
                   chunked(d, s, n, copy_kind::d2d, device_.compute_stream(), done);
                 });
  register_route(ms::host, ms::device, [this](void* d, const void* s, std::size_t n, event& done) {
    staged_h2d(d, s, n, done);
  });
  register_route(ms::device, ms::host, [this](void* d, const void* s, std::size_t n, event& done) {
    staged_d2h(d, s, n, done);
  });
  const auto host_to_host = [this](void* d, const void* s, std::size_t n, event&) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(d, s, n);
    const std::chrono::duration<double> busy = std::chrono::steady_clock::now() - t0;
    const std::lock_guard lock(mutex_);
    links_["h2h"].add(n, busy.count());
  };
  for (auto from : {ms::host, ms::host_pinned}) {
    for (auto to : {ms::host, ms::host_pinned}) {
      register_route(from, to, host_to_host);
    }
  }
}

transfer_engine::~transfer_engine() {
  for (auto& done : slot_done_) {
    try {
      done->synchronize();
    } catch (const std::exception& e) {
      detail::log(log_level::debug, std::string("transfer_engine: ") + e.what());
    }
  }
  if (bounce_ != nullptr) {
    device_.host_registration().unlock(bounce_, bounce_bytes_);
    std::free(bounce_);
  }
}

void transfer_engine::register_route(memory_space from, memory_space to, route r) {
  TIERFLOW_EXPECTS(r != nullptr, "transfer_engine: empty route");
  const std::lock_guard lock(mutex_);
  routes_[{from, to}] = std::move(r);
}

std::unique_ptr<event> transfer_engine::copy(void* dst, memory_space to, const void* src,
                                             memory_space from, std::size_t bytes) {
  auto done = device_.create_event();
  if (bytes == 0) {
    return done;
  }
  TIERFLOW_EXPECTS(dst != nullptr && src != nullptr, "transfer_engine::copy: null pointer");
  route r;
  {
    const std::lock_guard lock(mutex_);
    const auto it = routes_.find({from, to});
    TIERFLOW_EXPECTS(it != routes_.end(), "transfer_engine: no route from " +
                                              std::string(to_string(from)) + " to " +
                                              std::string(to_string(to)));
    r = it->second;
  }
  r(dst, src, bytes, *done);
  harvest();
  return done;
}

void transfer_engine::chunked(void* dst, const void* src, std::size_t bytes, copy_kind kind,
                              stream& on, event& done) {
  auto start = device_.create_event();
  on.record(*start);
  for (std::size_t offset = 0; offset < bytes; offset += options_.chunk_bytes) {
    const std::size_t n = std::min(options_.chunk_bytes, bytes - offset);
    device_.copy_async(static_cast<char*>(dst) + offset, static_cast<const char*>(src) + offset, n,
                       kind, on);
  }
  track(std::string(to_string(kind)), bytes, std::move(start), on);
  on.record(done);  // after the accounting's own end, so both have fired once `done` has
}

char* transfer_engine::bounce(std::size_t slot) {
  if (bounce_ == nullptr) {
    bounce_bytes_ = options_.chunk_bytes * options_.chunks_in_flight;
    bounce_bytes_ = detail::round_up(bounce_bytes_, 4096);
    bounce_ = std::aligned_alloc(4096, bounce_bytes_);
    if (bounce_ == nullptr) {
      throw out_of_capacity("transfer_engine bounce buffers", bounce_bytes_, {});
    }
    try {
      device_.host_registration().lock(bounce_, bounce_bytes_);
    } catch (...) {
      std::free(bounce_);
      bounce_ = nullptr;
      throw;
    }
    for (unsigned i = 0; i < options_.chunks_in_flight; ++i) {
      slot_done_.push_back(device_.create_event());
    }
  }
  return static_cast<char*>(bounce_) + slot * options_.chunk_bytes;
}

void transfer_engine::staged_h2d(void* dst, const void* src, std::size_t bytes, event& done) {
  const std::lock_guard staging(staging_mutex_);
  auto& s = device_.h2d_stream();
  auto start = device_.create_event();
  s.record(*start);
  const std::size_t slots = options_.chunks_in_flight;
  std::size_t index = 0;
  for (std::size_t offset = 0; offset < bytes; offset += options_.chunk_bytes, ++index) {
    const std::size_t n = std::min(options_.chunk_bytes, bytes - offset);
    const std::size_t slot = index % slots;
    char* buffer = bounce(slot);
    if (index >= slots) {
      slot_done_[slot]->synchronize();  // this transfer's own chunk: a failure is ours
    } else {
      settle(*slot_done_[slot]);
    }
    std::memcpy(buffer, static_cast<const char*>(src) + offset, n);
    device_.copy_async(static_cast<char*>(dst) + offset, buffer, n, copy_kind::h2d, s);
    s.record(*slot_done_[slot]);
  }
  track("h2d", bytes, std::move(start), s);
  s.record(done);
}

void transfer_engine::staged_d2h(void* dst, const void* src, std::size_t bytes, event& done) {
  const std::lock_guard staging(staging_mutex_);
  auto& s = device_.d2h_stream();
  auto start = device_.create_event();
  s.record(*start);
  const std::size_t slots = options_.chunks_in_flight;
  const std::size_t chunks = (bytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
  // Chunk i's bytes: wait for its DMA into the bounce buffer, then copy them out.
  auto drain = [&](std::size_t i) {
    const std::size_t offset = i * options_.chunk_bytes;
    const std::size_t n = std::min(options_.chunk_bytes, bytes - offset);
    slot_done_[i % slots]->synchronize();
    std::memcpy(static_cast<char*>(dst) + offset, bounce(i % slots), n);
  };
  for (std::size_t i = 0; i < chunks; ++i) {
    const std::size_t slot = i % slots;
    char* buffer = bounce(slot);
    if (i >= slots) {
      drain(i - slots);
    } else {
      settle(*slot_done_[slot]);
    }
    const std::size_t offset = i * options_.chunk_bytes;
    device_.copy_async(buffer, static_cast<const char*>(src) + offset,
                       std::min(options_.chunk_bytes, bytes - offset), copy_kind::d2h, s);
    s.record(*slot_done_[slot]);
  }
  for (std::size_t i = chunks > slots ? chunks - slots : 0; i < chunks; ++i) {
    drain(i);
  }
  track("d2h", bytes, std::move(start), s);
  s.record(done);
}

void transfer_engine::track(std::string link, std::size_t bytes, std::unique_ptr<event> start,
                            stream& on) {
  // The caller's event is theirs to drop: the accounting records its own end.
  auto finish = device_.create_event();
  on.record(*finish);
  const std::lock_guard lock(mutex_);
  auto entry = std::make_unique<pending>();
  entry->link = std::move(link);
  entry->bytes = bytes;
  entry->start = std::move(start);
  entry->end = std::move(finish);
  pending_.push_back(std::move(entry));
}

void transfer_engine::harvest() {
  const std::lock_guard lock(mutex_);
  std::erase_if(pending_, [&](const std::unique_ptr<pending>& p) {
    try {
      if (!p->end->query()) {
        return false;
      }
      p->end->synchronize();  // done: returns at once, or throws if its work failed
      links_[p->link].add(p->bytes, event::elapsed_ms(*p->start, *p->end) / 1e3);
    } catch (const std::exception& e) {
      detail::log(log_level::debug, std::string("transfer_engine: a failed transfer is not "
                                                "counted: ") +
                                        e.what());
    }
    return true;
  });
}

metrics::link_usage transfer_engine::link(std::string_view name) {
  harvest();
  const std::lock_guard lock(mutex_);
  const auto it = links_.find(name);
  return it == links_.end() ? metrics::link_usage{} : it->second.read();
}

std::string transfer_engine::links_json() {
  harvest();
  const std::lock_guard lock(mutex_);
  metrics::json_writer w;
  w.begin_object();
  for (const auto& [name, counter] : links_) {
    const auto u = counter.read();
    w.key(name).begin_object();
    w.key("bytes").value(u.bytes).key("transfers").value(u.transfers);
    w.key("busy_seconds").value(u.busy_seconds).key("achieved_gbps").value(u.achieved_gbps());
    w.end_object();
  }
  w.end_object();
  return w.str();
}

}  // namespace tierflow
