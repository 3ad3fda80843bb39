#include "tierflow/prefetch_scheduler.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <limits>
#include <mutex>
#include <set>

#include "schedule/scheduler_accounting.hpp"
#include "schedule/scheduler_events.hpp"
#include "schedule/staging_arena.hpp"
#include "schedule/staging_budget.hpp"
#include "schedule/staging_policy.hpp"
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

using detail::event_pool;
using detail::event_ptr;
using detail::fence;
using detail::fence_line;
using detail::page_spans;
using run = detail::step_run;

// The device side of a buffer; its staging state is the policy's (staging_policy::buffer).
struct buffer_state {
  buffer_desc desc;
  void* resident_copy = nullptr;  // in HBM, for resident buffers
  bool resident_dirty = false;
};

}  // namespace

// The scheduler drives the staging policy and is its device: streams, events and fences.
struct prefetch_scheduler::impl final : detail::staging_device {
  impl(device& d, schedule_plan p, scheduler_options o);
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl();

  // Members in destruction order's reverse: the pool outlives every event handed out.
  device& dev;
  schedule_plan plan;
  scheduler_options options;
  event_pool pool{dev};
  std::vector<buffer_state> buffers;
  std::vector<std::vector<buffer_id>> uses;  // of each step: every buffer, sorted, unique
  std::uint64_t resident_bytes = 0;
  // Staged ahead and dropped unused (flush, recovery); metrics() may read it from any thread.
  std::atomic<std::uint64_t> bytes_discarded{0};
  detail::staging_policy policy{*this, options.unit};

  void* hbm = nullptr;  // one allocation of the budget: resident copies, then staging
  char* staging_base = nullptr;
  std::vector<std::pair<char*, std::size_t>> registered;

  std::deque<run> staged;    // as the policy's staged runs (front: the acquired one, if any)
  run leaving;               // the run being released, between complete() and finished
  std::deque<run> finished;  // released, device work maybe in flight
  fence_line releases;
  fence_line writebacks;
  fence h2d_waited;  // fences the h2d stream has already waited for
  staged_step current;

  std::mutex accounting_mutex;  // guards accounting (metrics() may run on another thread)
  detail::scheduler_accounting accounting;

  void validate();
  void validate_buffers();
  void validate_steps();
  void allocate_and_upload();
  void upload_resident();
  void wait_fence(const fence& f);
  // staging_device: what the policy's decisions do on the device.
  void stage(std::uint64_t seq, const std::vector<buffer_id>& fetched, const fence& after) override;
  void launch() override;
  std::uint64_t complete(bool dirty) override;
  std::uint64_t write_back(const std::vector<buffer_id>& ids) override;
  std::string harvest();  // returns a failure, or empty
  void check();           // harvest; on failure recover and throw
  [[noreturn]] void fail(const std::string& what, const std::string& failure);
  void recover();
  void write_back_all(bool staged_too);
  void drop_staged();
  void release_locked(bool dirty);
  void flush_locked();
  const std::string& step_name(std::size_t s) const { return plan.steps[s].name; }
};

prefetch_scheduler::impl::impl(device& d, schedule_plan p, scheduler_options o)
    : dev(d), plan(std::move(p)), options(o) {
  validate();
  policy.set_window(options.adaptive ? 1 : options.window);
  policy.set_wrap(options.prefetch_across_iterations);
  accounting.start(dev, pool.get(), plan, options);
  allocate_and_upload();
}

void prefetch_scheduler::impl::validate() {
  const auto& o = options;
  TIERFLOW_EXPECTS(o.alignment > 0 && (o.alignment & (o.alignment - 1)) == 0,
                   "prefetch_scheduler: alignment must be a power of two");
  TIERFLOW_EXPECTS(!o.adaptive || o.unit == window_unit::steps,
                   "prefetch_scheduler: an adaptive window counts steps, not bytes");
  TIERFLOW_EXPECTS(!o.adaptive || o.max_window >= 1,
                   "prefetch_scheduler: max_window must be at least 1");
  TIERFLOW_EXPECTS(o.h2d_gbps >= 0 && o.d2h_gbps >= 0,
                   "prefetch_scheduler: link bandwidths must not be negative");
  TIERFLOW_EXPECTS(!plan.steps.empty(), "prefetch_scheduler: the plan has no steps");
  validate_buffers();
  validate_steps();
}

// Checks the buffers and gives the policy their sizes.
void prefetch_scheduler::impl::validate_buffers() {
  const auto& o = options;
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
    detail::staging_buffer s;
    s.bytes = b.bytes;
    s.aligned = detail::round_up(b.bytes, o.alignment);
    s.resident = b.resident;
    // A size near SIZE_MAX would round up to a small number and pass the budget check.
    TIERFLOW_EXPECTS(s.aligned >= b.bytes &&
                         resident_bytes <= std::numeric_limits<std::uint64_t>::max() - s.aligned,
                     "prefetch_scheduler: buffer '" + b.name + "' of " + std::to_string(b.bytes) +
                         " bytes is too large to stage");
    if (b.resident) {
      resident_bytes += s.aligned;
    }
    policy.add_buffer(s);
    buffers.push_back({b, nullptr, false});
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    TIERFLOW_EXPECTS(ranges[i - 1].first + ranges[i - 1].second <= ranges[i].first,
                     "prefetch_scheduler: two buffers overlap in host memory");
  }
}

// Checks the steps, gives the policy what each stages, and checks the budget holds the largest.
void prefetch_scheduler::impl::validate_steps() {
  std::set<std::string> step_names;
  const step_desc* largest = nullptr;
  std::uint64_t largest_bytes = 0;
  for (const auto& st : plan.steps) {
    TIERFLOW_EXPECTS(!st.name.empty(), "prefetch_scheduler: a step has no name");
    TIERFLOW_EXPECTS(step_names.insert(st.name).second,
                     "prefetch_scheduler: two steps are named '" + st.name + "'");
    std::vector<buffer_id> used;
    detail::staging_step info;
    for (const auto* list : {&st.reads, &st.writes}) {
      for (const auto id : *list) {
        TIERFLOW_EXPECTS(id < buffers.size(), "prefetch_scheduler: step '" + st.name +
                                                  "' names buffer " + std::to_string(id) + " of " +
                                                  std::to_string(buffers.size()));
        used.push_back(id);
      }
    }
    info.writes = st.writes;
    for (auto* v : {&used, &info.writes}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    for (const auto id : used) {
      if (!buffers[id].desc.resident) {
        info.staged.push_back(id);
        info.staged_bytes += policy.buffer(id).aligned;
      }
    }
    if (largest == nullptr || info.staged_bytes > largest_bytes) {
      largest = &st;
      largest_bytes = info.staged_bytes;
    }
    policy.add_step(std::move(info));
    uses.push_back(std::move(used));
  }
  if (options.hbm_budget_bytes == 0) {
    options.hbm_budget_bytes = detail::staging_budget(resident_bytes, largest_bytes, options);
  }
  if (resident_bytes + largest_bytes > options.hbm_budget_bytes) {
    throw error("prefetch_scheduler: HBM budget " + format_byte_count(options.hbm_budget_bytes) +
                " is too small: step '" + largest->name + "' needs " +
                format_byte_count(largest_bytes) + " of staging on top of " +
                format_byte_count(resident_bytes) + " of resident buffers");
  }
}

void prefetch_scheduler::impl::allocate_and_upload() {
  hbm = dev.memory().allocate(options.hbm_budget_bytes, options.alignment);
  staging_base = static_cast<char*>(hbm) + resident_bytes;
  policy.set_arena(options.hbm_budget_bytes - resident_bytes, options.alignment);
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
  for (buffer_id id = 0; id < buffers.size(); ++id) {
    if (buffers[id].desc.resident) {
      buffers[id].resident_copy = next;
      next += policy.buffer(id).aligned;
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

void prefetch_scheduler::impl::stage(std::uint64_t seq, const std::vector<buffer_id>& fetched,
                                     const fence& after) {
  run r;
  r.seq = seq;
  r.step = static_cast<std::size_t>(seq % uses.size());
  r.fetched = fetched;
  if (!r.fetched.empty()) {
    auto& h2d = dev.h2d_stream();
    wait_fence(after);
    r.h2d_start = pool.get();
    h2d.record(*r.h2d_start);
    for (std::size_t i = 0; i < r.fetched.size(); ++i) {
      const auto& b = buffers[r.fetched[i]];
      dev.copy_async(staging_base + policy.buffer(r.fetched[i]).offset, b.desc.data, b.desc.bytes,
                     copy_kind::h2d, h2d);
      if (options.trace || i + 1 == r.fetched.size()) {  // an event per copy only for the trace
        r.h2d_end.push_back(pool.get());
        h2d.record(*r.h2d_end.back());
      }
    }
  }
  staged.push_back(std::move(r));
}

void prefetch_scheduler::impl::launch() {
  auto& compute = dev.compute_stream();
  auto& r = staged.front();
  r.ready = pool.get();
  compute.record(*r.ready);
  if (!r.h2d_end.empty()) {
    compute.wait(*r.h2d_end.back());
  }
  r.begin = pool.get();
  compute.record(*r.begin);
}

std::uint64_t prefetch_scheduler::impl::complete(bool dirty) {
  leaving = std::move(staged.front());
  staged.pop_front();
  auto& r = leaving;
  r.done = pool.get();
  // harvest may come much later: judge the run by its own time
  r.budget_misses = policy.budget_misses();
  dev.compute_stream().record(*r.done);
  const auto release_seq = releases.push(r.done);
  if (dirty) {
    for (const auto id : policy.step(r.step).writes) {
      buffers[id].resident_dirty = buffers[id].resident_dirty || buffers[id].desc.resident;
    }
  }
  return release_seq;
}

std::uint64_t prefetch_scheduler::impl::write_back(const std::vector<buffer_id>& ids) {
  auto& r = leaving;
  auto& d2h = dev.d2h_stream();
  d2h.wait(*r.done);
  r.d2h_start = pool.get();
  d2h.record(*r.d2h_start);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& b = buffers[ids[i]];
    dev.copy_async(b.desc.data, staging_base + policy.buffer(ids[i]).offset, b.desc.bytes,
                   copy_kind::d2h, d2h);
    if (options.trace || i + 1 == ids.size()) {
      r.d2h_end.push_back(pool.get());
      d2h.record(*r.d2h_end.back());
    }
  }
  return writebacks.push(r.d2h_end.back());  // one fence for the batch
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
               std::to_string(r.seq / uses.size()) + "): " + ex.what();
      }
    }
    {
      const std::lock_guard lock(accounting_mutex);
      if (auto change = accounting.add(r, policy.window())) {
        policy.set_window(*change);
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
  leaving = {};
  // Continue counting iterations after the failed one, from whatever step comes next.
  policy.restart_after_failure();
}

void prefetch_scheduler::impl::release_locked(bool dirty) {
  auto written = policy.release(dirty);  // complete() took the run into leaving
  leaving.written = std::move(written);
  finished.push_back(std::move(leaving));
  policy.pump();
}

void prefetch_scheduler::impl::write_back_all(bool staged_too) {
  auto& d2h = dev.d2h_stream();
  auto after = pool.get();
  dev.compute_stream().record(*after);
  d2h.wait(*after);
  for (buffer_id id = 0; id < buffers.size(); ++id) {
    auto& b = buffers[id];
    if (b.resident_dirty) {
      dev.copy_async(b.desc.data, b.resident_copy, b.desc.bytes, copy_kind::d2h, d2h);
      b.resident_dirty = false;
    }
    const auto& slot = policy.buffer(id);
    if (staged_too && slot.staged && slot.dirty) {
      dev.copy_async(b.desc.data, staging_base + slot.offset, b.desc.bytes, copy_kind::d2h, d2h);
      policy.mark_clean(id);
    }
  }
}

// With the device idle: forget everything staged, so the tier copies rule.
void prefetch_scheduler::impl::drop_staged() {
  staged.clear();
  releases.clear();
  writebacks.clear();
  h2d_waited = {releases.last(), writebacks.last()};
  bytes_discarded += policy.drop_staged();
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
    if (s.policy.acquired()) {
      s.release_locked(false);
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
  const auto n = s.uses.size();
  TIERFLOW_EXPECTS(step < n, "prefetch_scheduler::acquire: step " + std::to_string(step) +
                                 " of a plan of " + std::to_string(n));
  TIERFLOW_EXPECTS(!s.policy.acquired(), "prefetch_scheduler::acquire: step '" +
                                             s.step_name(s.current.step_) +
                                             "' was acquired and not released");
  if (s.policy.has_position()) {
    const auto next = s.policy.position() % n;
    TIERFLOW_EXPECTS(next == step, "prefetch_scheduler::acquire: step '" + s.step_name(step) +
                                       "' out of order; the next step is '" + s.step_name(next) +
                                       "'");
  }
  s.check();
  auto& compute = s.dev.compute_stream();
  try {
    if (!s.policy.acquire(step)) {  // launch() made the compute wait for the fetch
      throw error("prefetch_scheduler: internal: step '" + s.step_name(step) +
                  "' does not fit an empty staging arena");
    }
  } catch (const device_error& ex) {
    s.fail("acquire of step '" + s.step_name(step) + "'", ex.what());
  }
  auto& cur = s.current;
  cur.step_ = step;
  cur.iteration_ = s.policy.position() / n;
  cur.compute_ = &compute;
  cur.pointers_.clear();
  for (const auto id : s.uses[step]) {
    const auto& b = s.buffers[id];
    cur.pointers_.emplace_back(
        id, b.desc.resident ? b.resident_copy : s.staging_base + s.policy.buffer(id).offset);
  }
  return cur;
}

void prefetch_scheduler::release(std::size_t step, bool dirty) {
  auto& s = *impl_;
  TIERFLOW_EXPECTS(
      s.policy.acquired() && s.current.step_ == step,
      "prefetch_scheduler::release: step " + std::to_string(step) + " is not the acquired step");
  try {
    s.release_locked(dirty);
  } catch (const device_error& ex) {
    s.fail("release of step '" + s.step_name(step) + "'", ex.what());
  }
  s.check();
}

void prefetch_scheduler::flush() {
  auto& s = *impl_;
  TIERFLOW_EXPECTS(!s.policy.acquired(), "prefetch_scheduler::flush: step '" +
                                             s.step_name(s.current.step_) +
                                             "' was acquired and not released");
  s.flush_locked();
}

void prefetch_scheduler::restart() {
  flush();
  impl_->policy.forget_position();
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
  m.hbm_staging_peak_bytes = s.policy.staging_used().read().peak;
  m.hbm_resident_bytes = s.resident_bytes;
  m.bytes_discarded = s.bytes_discarded.load();
  m.hbm_budget_bytes = s.options.hbm_budget_bytes;
  m.window = s.policy.window();
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
  return impl_->policy.window();
}

}  // namespace tierflow
