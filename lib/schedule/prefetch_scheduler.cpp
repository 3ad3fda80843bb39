#include "tierflow/prefetch_scheduler.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <limits>
#include <mutex>
#include <set>

#include <unistd.h>

#include "schedule/scheduler_accounting.hpp"
#include "schedule/staging_arena.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

buffer_id schedule_plan::add_buffer(buffer_desc buffer) {
  buffers.push_back(std::move(buffer));
  return static_cast<buffer_id>(buffers.size() - 1);
}

std::size_t schedule_plan::add_step(step_desc step) {
  steps.push_back(std::move(step));
  return steps.size() - 1;
}

std::string_view to_string(window_unit unit) noexcept {
  return unit == window_unit::steps ? "steps" : "bytes";
}

void* staged_step::pointer(buffer_id id) const {
  const auto it = std::lower_bound(pointers_.begin(), pointers_.end(), id,
                                   [](const auto& p, buffer_id b) { return p.first < b; });
  TIERFLOW_EXPECTS(it != pointers_.end() && it->first == id,
                   "staged_step::pointer: buffer " + std::to_string(id) +
                       " is neither used by step " + std::to_string(step_) + " nor resident");
  return it->second;
}

namespace {

using detail::event_ptr;
using detail::fence;
using run = detail::step_run;

// Events are made once and reused: the deleter of a handed-out pointer puts it back.
class event_pool {
 public:
  explicit event_pool(device& dev) : device_(dev) {}
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  event_ptr get() {
    std::unique_ptr<event> e;
    if (free_.empty()) {
      e = device_.create_event();
    } else {
      e = std::move(free_.back());
      free_.pop_back();
    }
    return event_ptr(e.release(), [this](event* p) noexcept {
      try {
        free_.emplace_back(p);
      } catch (...) {
        delete p;
      }
    });
  }

 private:
  device& device_;
  std::vector<std::unique_ptr<event>> free_;
};

// The fence events of one sequence (releases or write-backs), in order. Numbers start at 1.
class fence_line {
 public:
  std::uint64_t push(event_ptr e) {
    if (events_.empty()) {
      first_ = last_ + 1;
    }
    events_.push_back(std::move(e));
    return ++last_;
  }
  // The event of @p seq, or null when it has fired (pruned) or never existed.
  event* find(std::uint64_t seq) const {
    if (seq < first_ || seq > last_ || events_.empty()) {
      return nullptr;
    }
    return events_[seq - first_].get();
  }
  void prune() {
    while (!events_.empty() && events_.front()->query()) {
      events_.pop_front();
      ++first_;
    }
  }
  void clear() {
    events_.clear();
    first_ = last_ + 1;
  }
  [[nodiscard]] std::uint64_t last() const noexcept { return last_; }

 private:
  std::deque<event_ptr> events_;
  std::uint64_t first_ = 1;  // seq of events_.front()
  std::uint64_t last_ = 0;   // seq handed out last
};

struct buffer_state {
  buffer_desc desc;
  std::uint64_t aligned = 0;
  void* resident_copy = nullptr;  // in HBM, for resident buffers
  bool resident_dirty = false;
  // Staging (non-resident buffers): at most one staged copy at a time.
  bool staged = false;
  std::uint64_t offset = 0;
  std::uint32_t holders = 0;  // staged steps that use the copy
  bool dirty = false;
  std::uint64_t last_writeback = 0;  // fence seq of its last write-back to the tier
};

struct step_info {
  std::vector<buffer_id> uses;     // every buffer, sorted, unique
  std::vector<buffer_id> staged;   // the non-resident ones
  std::vector<buffer_id> writes;   // sorted, unique
  std::uint64_t staged_bytes = 0;  // aligned
};

// Disjoint page spans covering a set of host ranges (registering a page twice fails on CUDA).
std::vector<std::pair<char*, std::size_t>> page_spans(
    std::vector<std::pair<char*, std::size_t>> ranges) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<char*, std::size_t>> spans;
  for (const auto& [p, n] : ranges) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const auto begin = address / page * page;
    const auto end = detail::round_up(address + n, page);
    if (!spans.empty()) {
      auto& last = spans.back();
      const auto last_end = reinterpret_cast<std::uintptr_t>(last.first) + last.second;
      if (begin <= last_end) {
        last.second = std::max(last_end, end) - reinterpret_cast<std::uintptr_t>(last.first);
        continue;
      }
    }
    spans.emplace_back(reinterpret_cast<char*>(begin), end - begin);
  }
  return spans;
}

}  // namespace

struct prefetch_scheduler::impl {
  impl(device& d, schedule_plan p, scheduler_options o);
  ~impl();

  // Members in destruction order's reverse: the pool outlives every event handed out.
  device& dev;
  schedule_plan plan;
  scheduler_options options;
  event_pool pool{dev};
  std::vector<buffer_state> buffers;
  std::vector<step_info> steps;
  std::uint64_t resident_bytes = 0;

  void* hbm = nullptr;  // one allocation of the budget: resident copies, then staging
  char* staging_base = nullptr;
  detail::staging_arena arena{0, 1};
  metrics::usage_counter staging_used;
  std::vector<std::pair<char*, std::size_t>> registered;

  std::deque<run> staged;    // staged, not yet released (front: the acquired one, if any)
  std::deque<run> finished;  // released, device work maybe in flight
  bool acquired = false;
  bool has_position = false;
  std::uint64_t position = 0;  // seq of the next acquire (or the acquired one)
  std::atomic<std::uint64_t> window{0};
  std::uint64_t budget_misses = 0;  // prefetches the budget held back
  fence_line releases;
  fence_line writebacks;
  fence h2d_waited;  // fences the h2d stream has already waited for
  staged_step current;

  std::mutex accounting_mutex;  // guards accounting (metrics() may run on another thread)
  detail::scheduler_accounting accounting;

  void validate();
  void allocate_and_upload();
  void upload_resident();
  bool try_stage(std::uint64_t seq);
  void wait_fence(const fence& f);
  void pump();
  std::string harvest();  // returns a failure, or empty
  void check();           // harvest; on failure recover and throw
  [[noreturn]] void fail(const std::string& what, const std::string& failure);
  void recover();
  void write_back_all(bool staged_too);
  void drop_staged();
  void release_locked(std::size_t step, bool dirty);
  void flush_locked();
  std::uint64_t ahead() const { return staged.size() - (acquired ? 1 : 0); }
  const std::string& step_name(std::size_t s) const { return plan.steps[s].name; }
};

prefetch_scheduler::impl::impl(device& d, schedule_plan p, scheduler_options o)
    : dev(d), plan(std::move(p)), options(o) {
  validate();
  window = options.adaptive ? 1 : options.window;
  accounting.start(dev, pool.get(), plan, options);
  allocate_and_upload();
}

void prefetch_scheduler::impl::validate() {
  const auto& o = options;
  TIERFLOW_EXPECTS(o.hbm_budget_bytes > 0, "prefetch_scheduler: hbm_budget_bytes must be above 0");
  TIERFLOW_EXPECTS(o.alignment > 0 && (o.alignment & (o.alignment - 1)) == 0,
                   "prefetch_scheduler: alignment must be a power of two");
  TIERFLOW_EXPECTS(!o.adaptive || o.unit == window_unit::steps,
                   "prefetch_scheduler: an adaptive window counts steps, not bytes");
  TIERFLOW_EXPECTS(!o.adaptive || o.max_window >= 1,
                   "prefetch_scheduler: max_window must be at least 1");
  TIERFLOW_EXPECTS(o.h2d_gbps >= 0 && o.d2h_gbps >= 0,
                   "prefetch_scheduler: link bandwidths must not be negative");
  TIERFLOW_EXPECTS(!plan.steps.empty(), "prefetch_scheduler: the plan has no steps");
  std::set<std::string> names;
  std::vector<std::pair<char*, std::size_t>> ranges;
  for (const auto& b : plan.buffers) {
    TIERFLOW_EXPECTS(!b.name.empty(), "prefetch_scheduler: a buffer has no name");
    TIERFLOW_EXPECTS(names.insert(b.name).second,
                     "prefetch_scheduler: two buffers are named '" + b.name + "'");
    TIERFLOW_EXPECTS(b.data != nullptr, "prefetch_scheduler: buffer '" + b.name + "' is null");
    TIERFLOW_EXPECTS(b.bytes > 0, "prefetch_scheduler: buffer '" + b.name + "' has 0 bytes");
    // Ranges inside the address space keep the overlap check and the staging sums exact.
    TIERFLOW_EXPECTS(b.bytes <= std::numeric_limits<std::uintptr_t>::max() -
                                    reinterpret_cast<std::uintptr_t>(b.data),
                     "prefetch_scheduler: buffer '" + b.name + "' of " + std::to_string(b.bytes) +
                         " bytes is too large: it wraps the address space");
    ranges.emplace_back(static_cast<char*>(b.data), b.bytes);
    buffer_state s;
    s.desc = b;
    s.aligned = detail::round_up(b.bytes, o.alignment);
    // A size near SIZE_MAX would round up to a small number and pass the budget check.
    TIERFLOW_EXPECTS(s.aligned >= b.bytes &&
                         resident_bytes <= std::numeric_limits<std::uint64_t>::max() - s.aligned,
                     "prefetch_scheduler: buffer '" + b.name + "' of " + std::to_string(b.bytes) +
                         " bytes is too large to stage");
    if (b.resident) {
      resident_bytes += s.aligned;
    }
    buffers.push_back(std::move(s));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    TIERFLOW_EXPECTS(ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first,
                     "prefetch_scheduler: two buffers overlap in host memory");
  }
  std::set<std::string> step_names;
  const step_desc* largest = nullptr;
  std::uint64_t largest_bytes = 0;
  for (const auto& st : plan.steps) {
    TIERFLOW_EXPECTS(!st.name.empty(), "prefetch_scheduler: a step has no name");
    TIERFLOW_EXPECTS(step_names.insert(st.name).second,
                     "prefetch_scheduler: two steps are named '" + st.name + "'");
    step_info info;
    for (const auto* list : {&st.reads, &st.writes}) {
      for (const auto id : *list) {
        TIERFLOW_EXPECTS(id < buffers.size(), "prefetch_scheduler: step '" + st.name +
                                                  "' names buffer " + std::to_string(id) + " of " +
                                                  std::to_string(buffers.size()));
        info.uses.push_back(id);
      }
    }
    info.writes = st.writes;
    for (auto* v : {&info.uses, &info.writes}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    for (const auto id : info.uses) {
      if (!buffers[id].desc.resident) {
        info.staged.push_back(id);
        info.staged_bytes += buffers[id].aligned;
      }
    }
    if (largest == nullptr || info.staged_bytes > largest_bytes) {
      largest = &st;
      largest_bytes = info.staged_bytes;
    }
    steps.push_back(std::move(info));
  }
  if (resident_bytes + largest_bytes > o.hbm_budget_bytes) {
    throw error("prefetch_scheduler: HBM budget " + format_byte_count(o.hbm_budget_bytes) +
                " is too small: step '" + largest->name + "' needs " +
                format_byte_count(largest_bytes) + " of staging on top of " +
                format_byte_count(resident_bytes) + " of resident buffers");
  }
}

void prefetch_scheduler::impl::allocate_and_upload() {
  hbm = dev.memory().allocate(options.hbm_budget_bytes, options.alignment);
  staging_base = static_cast<char*>(hbm) + resident_bytes;
  arena = detail::staging_arena(options.hbm_budget_bytes - resident_bytes, options.alignment);
  std::vector<std::pair<char*, std::size_t>> to_register;
  for (const auto& b : buffers) {
    if (!b.desc.pinned) {
      to_register.emplace_back(static_cast<char*>(b.desc.data), b.desc.bytes);
    }
  }
  auto& locker = dev.host_registration();
  for (const auto& [p, n] : page_spans(std::move(to_register))) {
    locker.lock(p, n);  // on failure ~impl unlocks what was locked and frees the budget
    registered.emplace_back(p, n);
  }
  char* next = static_cast<char*>(hbm);
  for (auto& b : buffers) {
    if (b.desc.resident) {
      b.resident_copy = next;
      next += b.aligned;
    }
  }
  upload_resident();
}

// Copies every resident buffer from its tier copy into HBM and waits.
void prefetch_scheduler::impl::upload_resident() {
  if (resident_bytes == 0) {
    return;
  }
  for (auto& b : buffers) {
    if (b.desc.resident) {
      dev.copy_async(b.resident_copy, b.desc.data, b.desc.bytes, copy_kind::h2d, dev.h2d_stream());
      b.resident_dirty = false;
    }
  }
  dev.h2d_stream().synchronize();
}

prefetch_scheduler::impl::~impl() {
  staged.clear();
  finished.clear();
  auto& locker = dev.host_registration();
  for (const auto& [p, n] : registered) {
    locker.unlock(p, n);
  }
  if (hbm != nullptr) {
    dev.memory().deallocate(hbm, options.hbm_budget_bytes, options.alignment);
  }
}

void prefetch_scheduler::impl::wait_fence(const fence& f) {
  auto& h2d = dev.h2d_stream();
  if (f.compute > h2d_waited.compute) {
    if (auto* e = releases.find(f.compute)) {
      h2d.wait(*e);
    }
    h2d_waited.compute = f.compute;
  }
  if (f.writeback > h2d_waited.writeback) {
    if (auto* e = writebacks.find(f.writeback)) {
      h2d.wait(*e);
    }
    h2d_waited.writeback = f.writeback;
  }
}

bool prefetch_scheduler::impl::try_stage(std::uint64_t seq) {
  const auto step = static_cast<std::size_t>(seq % steps.size());
  const auto& info = steps[step];
  run r;
  r.seq = seq;
  r.step = step;
  std::vector<std::uint64_t> sizes;
  for (const auto id : info.staged) {
    if (!buffers[id].staged) {
      r.fetched.push_back(id);
      sizes.push_back(buffers[id].aligned);
    }
  }
  std::vector<std::uint64_t> offsets;
  fence after;
  if (!arena.allocate_all(sizes, offsets, after)) {
    return false;
  }
  for (const auto id : info.staged) {
    ++buffers[id].holders;
  }
  for (std::size_t i = 0; i < r.fetched.size(); ++i) {
    auto& b = buffers[r.fetched[i]];
    b.staged = true;
    b.offset = offsets[i];
    b.dirty = false;
    after.merge({0, b.last_writeback});
    staging_used.add(b.aligned);
  }
  if (!r.fetched.empty()) {
    auto& h2d = dev.h2d_stream();
    wait_fence(after);
    r.h2d_start = pool.get();
    h2d.record(*r.h2d_start);
    for (std::size_t i = 0; i < r.fetched.size(); ++i) {
      auto& b = buffers[r.fetched[i]];
      dev.copy_async(staging_base + b.offset, b.desc.data, b.desc.bytes, copy_kind::h2d, h2d);
      if (options.trace || i + 1 == r.fetched.size()) {  // an event per copy only for the trace
        r.h2d_end.push_back(pool.get());
        h2d.record(*r.h2d_end.back());
      }
    }
  }
  staged.push_back(std::move(r));
  return true;
}

void prefetch_scheduler::impl::pump() {
  if (!has_position) {
    return;
  }
  const auto n = steps.size();
  std::uint64_t bytes_ahead = 0;  // window in bytes: what the steps staged ahead hold
  if (options.unit == window_unit::bytes) {
    for (const auto& r : staged) {
      bytes_ahead += r.seq >= position + (acquired ? 1 : 0) ? steps[r.step].staged_bytes : 0;
    }
  }
  while (ahead() < n) {
    const auto next = staged.empty() ? position : staged.back().seq + 1;
    const auto next_bytes = steps[next % n].staged_bytes;
    if (options.unit == window_unit::steps ? ahead() >= window
                                           : bytes_ahead + next_bytes > window) {
      return;
    }
    if (!try_stage(next)) {
      ++budget_misses;
      return;
    }
    bytes_ahead += next_bytes;
  }
}

std::string prefetch_scheduler::impl::harvest() {
  while (!finished.empty()) {
    auto& r = finished.front();
    const std::array<event*, 3> last{r.h2d_end.empty() ? nullptr : r.h2d_end.back().get(),
                                     r.done.get(),
                                     r.d2h_end.empty() ? nullptr : r.d2h_end.back().get()};
    bool fired = true;
    for (auto* e : last) {
      fired = fired && (e == nullptr || e->query());
    }
    if (!fired) {
      break;
    }
    for (auto* e : last) {
      try {
        if (e != nullptr) {
          e->synchronize();  // fired: does not block; throws if its work failed
        }
      } catch (const device_error& ex) {
        return "step '" + step_name(r.step) + "' (iteration " +
               std::to_string(r.seq / steps.size()) + "): " + ex.what();
      }
    }
    {
      const std::lock_guard lock(accounting_mutex);
      if (auto change = accounting.add(r, window.load())) {
        window = *change;
      }
    }
    finished.pop_front();
  }
  releases.prune();
  writebacks.prune();
  return {};
}

void prefetch_scheduler::impl::check() {
  if (auto failure = harvest(); !failure.empty()) {
    fail("device work failed", failure);
  }
}

void prefetch_scheduler::impl::fail(const std::string& what, const std::string& failure) {
  recover();
  throw device_error("prefetch_scheduler: " + what + ": " + failure +
                     "; what was staged is discarded and each tier copy holds its last "
                     "completed write-back");
}

void prefetch_scheduler::impl::recover() {
  try {
    dev.synchronize();
  } catch (const std::exception& ex) {
    detail::log(log_level::debug, std::string("prefetch_scheduler: recovery: ") + ex.what());
  }
  {
    const std::lock_guard lock(accounting_mutex);
    accounting.discard(finished.size() + staged.size());
  }
  finished.clear();
  drop_staged();  // unwritten changes in staging are lost with the failed work
  // The tier copies are the truth now: resident copies are reloaded from them.
  try {
    upload_resident();
  } catch (const std::exception& ex) {
    detail::log(log_level::warning,
                std::string("prefetch_scheduler: reloading resident buffers: ") + ex.what());
  }
  acquired = false;
  // Continue counting iterations after the failed one, from whatever step comes next.
  has_position = false;
  position = (position / steps.size() + 1) * steps.size();
}

void prefetch_scheduler::impl::release_locked(std::size_t step, bool dirty) {
  auto& compute = dev.compute_stream();
  auto r = std::move(staged.front());
  staged.pop_front();
  acquired = false;
  ++position;
  r.done = pool.get();
  r.budget_misses = budget_misses;  // harvest may come much later: judge the run by its own time
  compute.record(*r.done);
  const auto release_seq = releases.push(r.done);
  const auto& info = steps[step];
  std::vector<buffer_id> write_back;
  for (const auto id : info.staged) {
    auto& b = buffers[id];
    if (dirty && std::binary_search(info.writes.begin(), info.writes.end(), id)) {
      b.dirty = true;
    }
    if (--b.holders == 0) {
      if (b.dirty) {
        write_back.push_back(id);
      } else {
        arena.free(b.offset, b.aligned, {release_seq, 0});
        b.staged = false;
        staging_used.sub(b.aligned);
      }
    }
  }
  if (dirty) {
    for (const auto id : info.writes) {
      buffers[id].resident_dirty = buffers[id].resident_dirty || buffers[id].desc.resident;
    }
  }
  if (!write_back.empty()) {
    auto& d2h = dev.d2h_stream();
    d2h.wait(*r.done);
    r.d2h_start = pool.get();
    d2h.record(*r.d2h_start);
    for (std::size_t i = 0; i < write_back.size(); ++i) {
      auto& b = buffers[write_back[i]];
      dev.copy_async(b.desc.data, staging_base + b.offset, b.desc.bytes, copy_kind::d2h, d2h);
      if (options.trace || i + 1 == write_back.size()) {
        r.d2h_end.push_back(pool.get());
        d2h.record(*r.d2h_end.back());
      }
    }
    const auto written = writebacks.push(r.d2h_end.back());  // one fence for the batch
    for (const auto id : write_back) {
      auto& b = buffers[id];
      b.last_writeback = written;
      arena.free(b.offset, b.aligned, {release_seq, written});
      b.staged = false;
      b.dirty = false;
      staging_used.sub(b.aligned);
    }
    r.written = std::move(write_back);
  }
  finished.push_back(std::move(r));
  pump();
}

void prefetch_scheduler::impl::write_back_all(bool staged_too) {
  auto& d2h = dev.d2h_stream();
  auto after = pool.get();
  dev.compute_stream().record(*after);
  d2h.wait(*after);
  for (auto& b : buffers) {
    if (b.resident_dirty) {
      dev.copy_async(b.desc.data, b.resident_copy, b.desc.bytes, copy_kind::d2h, d2h);
      b.resident_dirty = false;
    }
    if (staged_too && b.staged && b.dirty) {
      dev.copy_async(b.desc.data, staging_base + b.offset, b.desc.bytes, copy_kind::d2h, d2h);
      b.dirty = false;
    }
  }
}

// With the device idle: forget everything staged, so the tier copies rule.
void prefetch_scheduler::impl::drop_staged() {
  staged.clear();
  releases.clear();
  writebacks.clear();
  h2d_waited = {releases.last(), writebacks.last()};
  arena.reset();
  for (auto& b : buffers) {
    if (b.staged) {
      staging_used.sub(b.aligned);
    }
    b.staged = false;
    b.holders = 0;
    b.dirty = false;
  }
}

void prefetch_scheduler::impl::flush_locked() {
  check();
  try {
    write_back_all(true);
    dev.synchronize();
  } catch (const device_error& ex) {
    fail("flush failed", ex.what());
  }
  check();
  drop_staged();
}

// --- the public face ----------------------------------------------------------------------

prefetch_scheduler::prefetch_scheduler(device& dev, schedule_plan plan, scheduler_options options)
    : impl_(std::make_unique<impl>(dev, std::move(plan), options)) {}

prefetch_scheduler::~prefetch_scheduler() {
  auto& s = *impl_;
  try {
    if (s.acquired) {
      s.release_locked(s.current.step_, false);
    }
    s.flush_locked();
  } catch (const std::exception& ex) {
    detail::log(log_level::warning,
                std::string("prefetch_scheduler: at destruction: ") + ex.what());
  }
  try {
    s.dev.synchronize();
  } catch (const std::exception& ex) {
    detail::log(log_level::warning,
                std::string("prefetch_scheduler: at destruction: ") + ex.what());
  }
}

const staged_step& prefetch_scheduler::acquire(std::size_t step) {
  auto& s = *impl_;
  const auto n = s.steps.size();
  TIERFLOW_EXPECTS(step < n, "prefetch_scheduler::acquire: step " + std::to_string(step) +
                                 " of a plan of " + std::to_string(n));
  TIERFLOW_EXPECTS(!s.acquired, "prefetch_scheduler::acquire: step '" +
                                    s.step_name(s.current.step_) +
                                    "' was acquired and not released");
  if (s.has_position) {
    TIERFLOW_EXPECTS(s.position % n == step,
                     "prefetch_scheduler::acquire: step '" + s.step_name(step) +
                         "' out of order; the next step is '" + s.step_name(s.position % n) + "'");
  }
  s.check();
  if (!s.has_position) {
    s.position = s.position / n * n + step;
    s.has_position = true;
  }
  auto& compute = s.dev.compute_stream();
  try {
    if (s.staged.empty() && !s.try_stage(s.position)) {
      throw error("prefetch_scheduler: internal: step '" + s.step_name(step) +
                  "' does not fit an empty staging arena");
    }
    auto& r = s.staged.front();
    r.ready = s.pool.get();
    compute.record(*r.ready);
    if (!r.h2d_end.empty()) {
      compute.wait(*r.h2d_end.back());
    }
    r.begin = s.pool.get();
    compute.record(*r.begin);
    s.acquired = true;
    s.pump();
  } catch (const device_error& ex) {
    s.fail("acquire of step '" + s.step_name(step) + "'", ex.what());
  }
  auto& cur = s.current;
  cur.step_ = step;
  cur.iteration_ = s.position / n;
  cur.compute_ = &compute;
  cur.pointers_.clear();
  for (const auto id : s.steps[step].uses) {
    const auto& b = s.buffers[id];
    cur.pointers_.emplace_back(id, b.desc.resident ? b.resident_copy : s.staging_base + b.offset);
  }
  return cur;
}

void prefetch_scheduler::release(std::size_t step, bool dirty) {
  auto& s = *impl_;
  TIERFLOW_EXPECTS(
      s.acquired && s.current.step_ == step,
      "prefetch_scheduler::release: step " + std::to_string(step) + " is not the acquired step");
  try {
    s.release_locked(step, dirty);
  } catch (const device_error& ex) {
    s.fail("release of step '" + s.step_name(step) + "'", ex.what());
  }
  s.check();
}

void prefetch_scheduler::flush() {
  auto& s = *impl_;
  TIERFLOW_EXPECTS(!s.acquired, "prefetch_scheduler::flush: step '" + s.step_name(s.current.step_) +
                                    "' was acquired and not released");
  s.flush_locked();
}

void* prefetch_scheduler::resident_pointer(buffer_id id) const {
  const auto& s = *impl_;
  TIERFLOW_EXPECTS(
      id < s.buffers.size() && s.buffers[id].desc.resident,
      "prefetch_scheduler::resident_pointer: buffer " + std::to_string(id) + " is not resident");
  return s.buffers[id].resident_copy;
}

scheduler_metrics prefetch_scheduler::metrics() {
  auto& s = *impl_;
  const std::lock_guard lock(s.accounting_mutex);
  auto m = s.accounting.snapshot();
  m.hbm_staging_peak_bytes = s.staging_used.read().peak;
  m.hbm_resident_bytes = s.resident_bytes;
  m.hbm_budget_bytes = s.options.hbm_budget_bytes;
  m.window = s.window;
  return m;
}

std::string prefetch_scheduler::snapshot_json() {
  return "{\"schema_version\":" + std::to_string(metrics::snapshot_schema_version) +
         ",\"scheduler\":" + metrics().to_json() + "}";
}

std::string prefetch_scheduler::prometheus_text() {
  metrics::prometheus_writer out;
  metrics().to_prometheus(out);
  return out.str();
}

std::string prefetch_scheduler::trace_json() {
  auto& s = *impl_;
  const std::lock_guard lock(s.accounting_mutex);
  return s.accounting.trace().json();
}

const schedule_plan& prefetch_scheduler::plan() const noexcept {
  return impl_->plan;
}
const scheduler_options& prefetch_scheduler::options() const noexcept {
  return impl_->options;
}
std::uint64_t prefetch_scheduler::window() const noexcept {
  return impl_->window;
}

}  // namespace tierflow
