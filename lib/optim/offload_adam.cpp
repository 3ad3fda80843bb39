// offload_adam: state in tiers, the step in the tier (cpu) or streamed through HBM (streamed).
//
// cpu mode, one step:
//   1. the D2H stream waits for the compute stream (the backward pass), then copies each
//      chunk's grads into a host buffer, recording an event per chunk;
//   2. the workers take chunks in order as they land and sum their squares (the norm pass
//      overlaps the copies); partial sums are per chunk, so the total does not depend on
//      which thread took which chunk;
//   3. with the norm known (and finite), the workers update each chunk in place, convert it
//      to the param dtype into a pinned ring slot and enqueue its H2D: the copy of one chunk
//      overlaps the update of the next.
// streamed mode: the norm pass runs on the device, then the prefetch scheduler streams each
// chunk's master weights and moments into HBM, the kernel (on the emulated device its CPU
// twin, a host callback) updates them and the device params in place, and the scheduler
// writes them back behind.
//
// All or nothing (docs/reliability.md). cpu mode updates the state only once every grad has
// landed, so a failed grads copy leaves it untouched; a failed params upload comes after the
// state has stepped, so the step counts as applied and the params are re-sent before the
// next use (params_stale). streamed mode cannot roll back chunks whose write-back landed, so
// it rolls forward: once a chunk is staged, a device-to-device copy on the compute stream,
// before its kernel, snapshots its pre-step state into a small undo ring in HBM; a chunk's
// slot is reused only once an event after its write-back has fired. On failure the chunks
// whose write-back surely landed hold the step, D2H copies from the ring restore the others
// to their pre-step state, and the host runs the step for those from their grads (the same
// kernels, so the same bits); with no chunk written back the step is rolled back.
#include "tierflow/offload_adam.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "optim/adam_checkpoint.hpp"
#include "optim/adam_internal.hpp"
#include "optim/adam_kernels.hpp"
#include "optim/worker_pool.hpp"
#include "tierflow/log.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/where.hpp"

namespace tierflow {

std::string_view to_string(param_dtype dtype) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      return "f32";
    case param_dtype::bf16:
      return "bf16";
    case param_dtype::f16:
      return "f16";
  }
  return "unknown";
}

std::size_t dtype_bytes(param_dtype dtype) noexcept {
  return dtype == param_dtype::f32 ? 4 : 2;
}

std::string_view to_string(adam_mode mode) noexcept {
  switch (mode) {
    case adam_mode::cpu:
      return "cpu";
    case adam_mode::streamed:
      return "streamed";
    case adam_mode::automatic:
      return "auto";
  }
  return "unknown";
}

adam_step_error::adam_step_error(const std::string& what, outcome result)
    : device_error(what), outcome_(result) {}

std::string_view to_string(adam_step_error::outcome outcome) noexcept {
  switch (outcome) {
    case adam_step_error::outcome::not_applied:
      return "not_applied";
    case adam_step_error::outcome::applied:
      return "applied";
    case adam_step_error::outcome::pending:
      return "pending";
  }
  return "unknown";
}

std::optional<adam_mode> parse_adam_mode(std::string_view text) noexcept {
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed, adam_mode::automatic}) {
    if (text == to_string(mode)) {
      return mode;
    }
  }
  return std::nullopt;
}

namespace detail {

namespace {

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

void check_hyper(const adam_hyper& h, const std::string& where) {
  const auto fail = [&](const std::string& what, double value) {
    throw error("offload_adam: " + where + ": " + what + ", not " + number(value));
  };
  if (!std::isfinite(h.lr) || h.lr < 0) {
    fail("lr must be finite and >= 0", h.lr);
  }
  if (!(h.beta1 >= 0 && h.beta1 < 1)) {
    fail("beta1 must be in [0, 1)", h.beta1);
  }
  if (!(h.beta2 >= 0 && h.beta2 < 1)) {
    fail("beta2 must be in [0, 1)", h.beta2);
  }
  if (!std::isfinite(h.eps) || h.eps <= 0) {
    fail("eps must be finite and > 0", h.eps);
  }
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0) {
    fail("weight_decay must be finite and >= 0", h.weight_decay);
  }
  if (h.decay != weight_decay_mode::decoupled && h.decay != weight_decay_mode::l2) {
    throw error("offload_adam: " + where + ": unknown weight decay mode");
  }
}

}  // namespace detail

using detail::adam_scalars;
using detail::chunk_ref;
using detail::param_state;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// The device work a step depends on did not finish by the step's deadline
// (adam_options::device_timeout_s); the work itself is still queued.
class device_timeout : public device_error {
 public:
  using device_error::device_error;
};

// When the wait for the work a step depends on gives up (none: never).
using step_deadline = std::optional<clock_type::time_point>;

step_deadline deadline_after(double seconds) {
  if (seconds <= 0) {
    return std::nullopt;
  }
  return clock_type::now() +
         std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
}

// Waits for @p e: as long as it takes without a deadline, else polling until the deadline
// (the device interface has no timed wait), with a short back-off so that a late event costs
// little. @throws device_timeout when the deadline passes first; device_error when the work
// failed
void await(event& e, const step_deadline& deadline, const char* what) {
  if (!deadline) {
    e.synchronize();
    return;
  }
  auto pause = std::chrono::microseconds(10);
  while (!e.query()) {
    if (clock_type::now() >= *deadline) {
      throw device_timeout(std::string("timed out waiting for ") + what);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  e.synchronize();  // reports a failure
}

unsigned usable_cpus() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

// The node holding most of [p, p + bytes), or -1 when unknown (not faulted in, no NUMA).
int node_of(const void* p, std::size_t bytes) {
  try {
    const page_residency r = where(p, bytes);
    int best = -1;
    std::size_t most = 0;
    for (const auto& [node, pages] : r.pages_on_node) {
      if (pages > most) {
        best = node;
        most = pages;
      }
    }
    return best;
  } catch (const std::exception&) {
    return -1;
  }
}

// Host memory registered with the device for its lifetime.
struct registration {
  page_locker* locker = nullptr;
  void* address = nullptr;
  std::size_t bytes = 0;
};

}  // namespace

struct offload_adam::impl {
  device& dev;
  adam_options options;
  placement_policy& placement;
  std::vector<detail::group_state> groups;
  std::vector<chunk_ref> chunks;
  adam_kernel kernel = adam_kernel::scalar;
  adam_mode mode = adam_mode::cpu;
  std::string mode_reason;
  std::uint64_t total_elements = 0;

  tier_allocation grads_host;         // every param's grads, dtype as on the device
  std::vector<tier_allocation> ring;  // cpu mode: 16-bit params on their way to the device
  std::unique_ptr<std::mutex[]> ring_mutex;
  std::vector<std::unique_ptr<event>> ring_events;
  std::vector<std::unique_ptr<event>> chunk_events;
  std::unique_ptr<event> compute_done;
  std::vector<registration> registered;
  std::map<int, std::unique_ptr<detail::worker_pool>> pools;  // by node (-1: unpinned)
  std::map<int, std::vector<std::size_t>> chunks_by_node;
  unsigned threads = 0;
  std::vector<double> partial;  // per chunk: Σ g²

  // streamed mode
  std::unique_ptr<prefetch_scheduler> scheduler;
  std::vector<std::array<buffer_id, 3>> chunk_buffers;  // master, m, v
  std::unique_ptr<detail::device_adam> device_side;
  // The undo ring, in HBM beside the scheduler's staging budget (one allocation): each slot
  // holds one chunk's pre-step master, m and v (3 × largest chunk floats), copied from its
  // staging on the compute stream before its kernel; undo_events[slot] is recorded after it.
  void* undo_hbm = nullptr;
  std::size_t undo_hbm_bytes = 0;
  std::vector<std::unique_ptr<event>> undo_events;
  std::vector<std::size_t> undo_chunk;  // the chunk in each slot this step (none: empty)
  std::vector<char> written_back;       // per chunk: its write-back event was recorded
  // Whether an event recorded after a chunk's release covers its write-back: not when the
  // window spans the plan (a chunk staged again for the next pass defers its write-back).
  bool trust_writeback_events = false;
  std::size_t largest_chunk = 0;

  // Reliability
  bool params_stale = false;  // the device params lag the master weights
  struct pending_step {
    std::vector<std::size_t> chunks;  // at the pre-step state once `restore` is done
    std::vector<adam_scalars> scalars;
    // (chunk, undo slot): chunks to copy back from the HBM undo ring first (their restore
    // failed); those slots are not reused while the step is pending.
    std::vector<std::pair<std::size_t, std::size_t>> restore;
    adam_step_result result;
  };
  std::optional<pending_step> pending;

  adam_metrics totals;

  impl(device& d, adam_options o, placement_policy& p)
      : dev(d), options(std::move(o)), placement(p) {}

  ~impl() {
    scheduler.reset();
    try {
      dev.synchronize();
    } catch (const std::exception& e) {
      detail::log(log_level::warning,
                  std::string("offload_adam: device work failed while shutting down: ") + e.what());
    }
    for (const auto& r : registered) {
      r.locker->unlock(r.address, r.bytes);
    }
    if (undo_hbm != nullptr) {
      dev.memory().deallocate(undo_hbm, undo_hbm_bytes);
    }
  }

  void register_host(void* address, std::size_t bytes) {
    page_locker& locker = dev.host_registration();
    locker.lock(address, bytes);
    registered.push_back({&locker, address, bytes});
  }

  void validate(const std::vector<adam_group>& in) const;
  void allocate_state(std::vector<adam_group>& in);
  void make_chunks();
  void choose_mode();
  void start_workers();
  void read_initial_params();
  void build_streamed();
  adam_step_result run_cpu_step(adam_step_result result);
  adam_step_result run_streamed_step(adam_step_result result);
  void upload_params();
  bool try_upload_params(std::string& failure);
  void resend_stale_params(const char* during);
  void settle_device() noexcept;
  [[nodiscard]] adam_step_error timed_out(const char* in_mode, const device_timeout& e) const;
  [[nodiscard]] adam_step_error failed_before_update(const char* in_mode, const char* what,
                                                     const device_error& e);
  void save_undo(const chunk_ref& c, stream& on, const float* master, const float* m,
                 const float* v);
  float* undo_slot(std::size_t slot) const {
    return static_cast<float*>(undo_hbm) + slot * 3 * largest_chunk;
  }
  bool restore_from_undo(const std::vector<std::pair<std::size_t, std::size_t>>& restore,
                         std::string& failure);
  [[noreturn]] void recover_streamed(adam_step_result result,
                                     const std::vector<adam_scalars>& scalars,
                                     std::optional<std::size_t> acquired,
                                     const std::string& failure);
  bool finish_on_host(const std::vector<std::size_t>& rest,
                      const std::vector<adam_scalars>& scalars, std::string& failure);
  adam_step_result complete_pending();
  void flush_state();
  adam_scalars scalars_for(std::size_t group, double grad_scale) const {
    const auto& g = groups[group];
    return detail::make_adam_scalars(g.hyper, g.steps + 1, grad_scale);
  }
  const detail::group_state& group_at(std::size_t group) const {
    if (group >= groups.size()) {
      throw error("offload_adam: group " + std::to_string(group) + " out of range (" +
                  std::to_string(groups.size()) + " groups)");
    }
    return groups[group];
  }
  const param_state& param_at(std::size_t group, std::size_t param) const {
    const auto& g = group_at(group);
    if (param >= g.params.size()) {
      throw error("offload_adam: param " + std::to_string(param) + " of group " +
                  std::to_string(group) + " out of range (" + std::to_string(g.params.size()) +
                  " params)");
    }
    return g.params[param];
  }
  std::string skip_reason() const;
  // From the chunks' Σ g²: the norm, the clip coefficient and each group's scalars; false
  // (with the reason in @p result) when a grad is not finite.
  bool judge_grads(adam_step_result& result, std::vector<adam_scalars>& scalars) const {
    double total = 0;
    for (double sum : partial) {
      total += sum;
    }
    result.grad_norm = std::sqrt(total) / options.loss_scale;
    if (!std::isfinite(result.grad_norm)) {
      result.skip_reason = skip_reason();
      return false;
    }
    if (options.max_grad_norm > 0) {
      result.clip_coef = std::min(1.0, options.max_grad_norm / (result.grad_norm + 1e-6));
    }
    const double grad_scale = result.clip_coef / options.loss_scale;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      scalars.push_back(scalars_for(g, grad_scale));
    }
    return true;
  }
};

void offload_adam::impl::validate(const std::vector<adam_group>& in) const {
  TIERFLOW_EXPECTS(!in.empty(), "offload_adam needs at least one parameter group");
  if (options.chunk_elements == 0) {
    throw error("offload_adam: chunk_elements must be > 0");
  }
  if (!std::isfinite(options.loss_scale) || options.loss_scale <= 0) {
    throw error("offload_adam: loss_scale must be finite and > 0, not " +
                std::to_string(options.loss_scale));
  }
  if (!std::isfinite(options.max_grad_norm) || options.max_grad_norm < 0) {
    throw error("offload_adam: max_grad_norm must be finite and >= 0 (0: no clipping), not " +
                std::to_string(options.max_grad_norm));
  }
  for (double rate : {options.h2d_gbps, options.d2h_gbps, options.host_memory_gbps}) {
    if (!std::isfinite(rate) || rate < 0) {
      throw error("offload_adam: measured rates must be finite and >= 0 (0: unknown)");
    }
  }
  if (!std::isfinite(options.device_timeout_s) || options.device_timeout_s < 0) {
    throw error("offload_adam: device_timeout_s must be finite and >= 0 (0: wait forever), not " +
                std::to_string(options.device_timeout_s));
  }
  std::set<std::string> names;
  for (std::size_t gi = 0; gi < in.size(); ++gi) {
    const std::string where = "group " + std::to_string(gi);
    detail::check_hyper(in[gi].hyper, where);
    if (in[gi].params.empty()) {
      throw error("offload_adam: " + where + " has no parameters");
    }
    for (std::size_t pi = 0; pi < in[gi].params.size(); ++pi) {
      const adam_param& p = in[gi].params[pi];
      const std::string what =
          where + " param " + std::to_string(pi) + (p.name.empty() ? "" : " '" + p.name + "'");
      if (p.param == nullptr) {
        throw error("offload_adam: " + what + ": param pointer is null");
      }
      if (p.grad == nullptr) {
        throw error("offload_adam: " + what + ": grad pointer is null");
      }
      if (p.elements == 0) {
        throw error("offload_adam: " + what + ": zero elements");
      }
      // The state takes 12 bytes per element (master, m, v); a count whose byte sizes wrap
      // would allocate a few bytes and then copy far past them.
      if (p.elements > std::numeric_limits<std::size_t>::max() / (3 * sizeof(float))) {
        throw error("offload_adam: " + what + ": " + std::to_string(p.elements) +
                    " elements is too many (the state would not fit in memory)");
      }
      if (p.dtype != param_dtype::f32 && p.dtype != param_dtype::bf16 &&
          p.dtype != param_dtype::f16) {
        throw error("offload_adam: " + what + ": unknown dtype");
      }
      if (p.param_on_host && options.mode == adam_mode::streamed) {
        throw error("offload_adam: " + what +
                    ": a param in host memory needs cpu mode (streamed mode updates params on "
                    "the device)");
      }
      if (!names.insert(p.name).second) {
        throw error("offload_adam: " + what + ": the name is used twice");
      }
    }
  }
}

void offload_adam::impl::allocate_state(std::vector<adam_group>& in) {
  std::size_t grad_bytes = 0;
  for (std::size_t gi = 0; gi < in.size(); ++gi) {
    detail::group_state g;
    g.hyper = in[gi].hyper;
    for (std::size_t pi = 0; pi < in[gi].params.size(); ++pi) {
      adam_param& desc = in[gi].params[pi];
      if (desc.name.empty()) {
        desc.name = "g" + std::to_string(gi) + ".p" + std::to_string(pi);
      }
      param_state p;
      p.desc = desc;
      p.master = placement.allocate(data_class::master_params, desc.elements * sizeof(float));
      p.moments =
          placement.allocate(data_class::optimizer_state, 2 * desc.elements * sizeof(float));
      std::memset(p.moments.data(), 0, p.moments.size());
      p.grad_offset = grad_bytes;
      grad_bytes += (desc.elements * dtype_bytes(desc.dtype) + 63) / 64 * 64;
      total_elements += desc.elements;
      totals.state_bytes += p.master.size() + p.moments.size();
      g.params.push_back(std::move(p));
    }
    groups.push_back(std::move(g));
  }
  grads_host = placement.allocate(data_class::grads, grad_bytes);
  register_host(grads_host.data(), grads_host.size());
  for (auto& g : groups) {
    for (auto& p : g.params) {
      register_host(p.master.data(), p.master.size());
      register_host(p.moments.data(), p.moments.size());
    }
  }
}

void offload_adam::impl::make_chunks() {
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    for (std::size_t pi = 0; pi < groups[gi].params.size(); ++pi) {
      const param_state& p = groups[gi].params[pi];
      for (std::size_t off = 0; off < p.desc.elements; off += options.chunk_elements) {
        chunk_ref c;
        c.group = gi;
        c.param = pi;
        c.offset = off;
        c.count = std::min(options.chunk_elements, p.desc.elements - off);
        c.index = chunks.size();
        c.node = node_of(p.moments_m() + off, c.count * sizeof(float));
        chunks.push_back(c);
      }
    }
  }
  partial.assign(chunks.size(), 0.0);
  totals.chunks = chunks.size();
  totals.params = total_elements;
}

void offload_adam::impl::choose_mode() {
  const auto& props = dev.properties();
  if (options.mode != adam_mode::automatic) {
    mode = options.mode;
    mode_reason = "asked for";
    return;
  }
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      if (p.desc.param_on_host) {
        mode = adam_mode::cpu;
        mode_reason = "param '" + p.desc.name + "' lives in host memory";
        return;
      }
    }
  }
  // Bytes per param: cpu mode moves the grad down and the param up over the link and touches
  // 28 B in host memory (read p, g, m, v; write p, m, v); streamed mode moves the 12 B of
  // state each way and updates in HBM.
  double param_bytes = 0;
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      param_bytes += static_cast<double>(p.desc.elements * dtype_bytes(p.desc.dtype));
    }
  }
  const double per_param = param_bytes / static_cast<double>(total_elements);
  const double h2d = options.h2d_gbps > 0 ? options.h2d_gbps : props.h2d_gbps.value_or(25.0);
  const double d2h = options.d2h_gbps > 0 ? options.d2h_gbps : props.d2h_gbps.value_or(25.0);
  // Host memory rate: the caller's, else what tierflow bench measured for the nodes that hold
  // the state (read 16 B, write 12 B per param; the slowest node decides), else a quick copy.
  double host = options.host_memory_gbps;
  std::string host_source = "given";
  if (host <= 0) {
    const auto& topo = placement.machine();
    std::set<int> nodes;
    for (const auto& c : chunks) {
      nodes.insert(c.node);
    }
    double slowest = 0;
    for (const int n : nodes) {
      const auto perf = topo.access(topo.initiator(), numa_node_id{n});
      if (n < 0 || perf.read_bandwidth.source != attr_source::measured) {
        slowest = 0;
        break;
      }
      const double read = perf.read_bandwidth.value / 1000.0;  // MB/s -> GB/s
      const double write = perf.write_bandwidth.source == attr_source::measured
                               ? perf.write_bandwidth.value / 1000.0
                               : read;
      const double rate = 28.0 / (16.0 / read + 12.0 / write);
      slowest = slowest == 0 ? rate : std::min(slowest, rate);
    }
    host = slowest > 0 ? slowest : detail::measure_host_bandwidth_gbps();
    host_source = slowest > 0 ? "measured by tierflow bench" : "a 32 MiB copy just now";
  }
  const double cpu_ns = per_param / d2h + std::max(28.0 / host, per_param / h2d);
  const double streamed_ns =
      props.full_duplex ? std::max(12.0 / h2d, 12.0 / d2h) : 12.0 / h2d + 12.0 / d2h;
  std::ostringstream why;
  why.precision(3);
  why << "cpu " << cpu_ns << " ns/param (grads " << per_param << " B down at " << d2h
      << " GB/s, then 28 B through host memory at " << host << " GB/s, " << host_source
      << ") vs streamed " << streamed_ns << " ns/param (12 B of state each way at " << h2d << "/"
      << d2h << " GB/s)";
  mode = cpu_ns <= streamed_ns ? adam_mode::cpu : adam_mode::streamed;
  mode_reason = why.str();
}

void offload_adam::impl::start_workers() {
  for (const auto& c : chunks) {
    chunks_by_node[c.node].push_back(c.index);
  }
  threads = options.threads != 0 ? options.threads : usable_cpus();
  threads = std::max<unsigned>(threads, static_cast<unsigned>(chunks_by_node.size()));
  // Workers per node in proportion to its chunks, at least one each.
  unsigned left = threads;
  std::size_t chunks_left = chunks.size();
  for (auto it = chunks_by_node.begin(); it != chunks_by_node.end(); ++it) {
    const std::size_t nodes_after =
        static_cast<std::size_t>(std::distance(it, chunks_by_node.end())) - 1;
    unsigned n = static_cast<unsigned>(std::max<std::size_t>(
        1, (static_cast<std::size_t>(left) * it->second.size() + chunks_left / 2) / chunks_left));
    n = std::min<unsigned>(n, left - static_cast<unsigned>(nodes_after));
    left -= n;
    chunks_left -= it->second.size();
    pools[it->first] = std::make_unique<detail::worker_pool>(std::vector<int>(n, it->first));
  }
  totals.threads = threads;
}

void offload_adam::impl::read_initial_params() {
  stream& d2h = dev.d2h_stream();
  compute_done = dev.create_event();
  dev.compute_stream().record(*compute_done);
  d2h.wait(*compute_done);
  auto* host = static_cast<unsigned char*>(grads_host.data());
  for (auto& g : groups) {
    for (auto& p : g.params) {
      if (!p.desc.param_on_host) {
        dev.copy_async(host + p.grad_offset, p.desc.param,
                       p.desc.elements * dtype_bytes(p.desc.dtype), copy_kind::d2h, d2h);
      }
    }
  }
  d2h.synchronize();
  for (auto& g : groups) {
    for (auto& p : g.params) {
      detail::load_as_f32(p.desc.param_on_host ? p.desc.param : host + p.grad_offset, p.desc.dtype,
                          p.master_p(), p.desc.elements);
    }
  }
}

void offload_adam::impl::build_streamed() {
  schedule_plan plan;
  std::uint64_t largest = 0;
  for (const auto& c : chunks) {
    param_state& p = groups[c.group].params[c.param];
    const std::size_t bytes = c.count * sizeof(float);
    const std::string base = p.desc.name + "#" + std::to_string(c.offset / options.chunk_elements);
    std::array<buffer_id, 3> ids{};
    ids[0] = plan.add_buffer({base + ".master", p.master_p() + c.offset, bytes, false, true});
    ids[1] = plan.add_buffer({base + ".exp_avg", p.moments_m() + c.offset, bytes, false, true});
    ids[2] = plan.add_buffer({base + ".exp_avg_sq", p.moments_v() + c.offset, bytes, false, true});
    plan.add_step({base, {}, {ids[0], ids[1], ids[2]}});
    chunk_buffers.push_back(ids);
    largest = std::max<std::uint64_t>(largest, 3 * (bytes + 256));
  }
  scheduler_options so;
  so.window = options.window;
  so.hbm_budget_bytes =
      options.hbm_budget_bytes != 0 ? options.hbm_budget_bytes : (options.window + 2) * largest;
  so.h2d_gbps = options.h2d_gbps;
  so.d2h_gbps = options.d2h_gbps;
  scheduler = std::make_unique<prefetch_scheduler>(dev, std::move(plan), so);
  device_side = detail::make_device_adam(dev, kernel, chunks.size());
  // A chunk is staged again for the next pass only when the window spans the plan; then its
  // write-back waits for that pass, and only the end-of-step flush commits it.
  trust_writeback_events = chunks.size() > options.window;
  // Write-backs in flight are bounded by the staging slots (window + 2 by default): a few
  // more ring slots keep the host from waiting for them; every chunk when none is trusted.
  const std::size_t slots =
      trust_writeback_events
          ? std::min<std::size_t>(chunks.size(), static_cast<std::size_t>(options.window) + 3)
          : chunks.size();
  for (const auto& c : chunks) {
    largest_chunk = std::max(largest_chunk, c.count);
  }
  undo_hbm_bytes = slots * 3 * largest_chunk * sizeof(float);
  undo_hbm = dev.memory().allocate(undo_hbm_bytes);
  totals.hbm_undo_bytes = undo_hbm_bytes;
  for (std::size_t i = 0; i < slots; ++i) {
    undo_events.push_back(dev.create_event());
  }
  undo_chunk.assign(slots, chunks.size());
  written_back.assign(chunks.size(), 0);
}

std::string offload_adam::impl::skip_reason() const {
  for (const auto& c : chunks) {
    if (!std::isfinite(partial[c.index])) {
      const auto& p = groups[c.group].params[c.param];
      return "non-finite grad in '" + p.desc.name + "' (elements " + std::to_string(c.offset) +
             ".." + std::to_string(c.offset + c.count - 1) + "): step skipped, state unchanged";
    }
  }
  return "non-finite grad norm: step skipped, state unchanged";
}

adam_step_result offload_adam::impl::run_cpu_step(adam_step_result result) {
  stream& d2h = dev.d2h_stream();
  stream& h2d = dev.h2d_stream();
  auto* host = static_cast<unsigned char*>(grads_host.data());
  const auto grads_start = clock_type::now();
  const step_deadline deadline = deadline_after(options.device_timeout_s);

  // 1. Grads down, chunk by chunk, after the work that made them.
  dev.compute_stream().record(*compute_done);
  d2h.wait(*compute_done);
  for (const auto& c : chunks) {
    const param_state& p = groups[c.group].params[c.param];
    const std::size_t eb = dtype_bytes(p.desc.dtype);
    dev.copy_async(host + p.grad_offset + c.offset * eb,
                   static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb, c.count * eb,
                   copy_kind::d2h, d2h);
    d2h.record(*chunk_events[c.index]);
    totals.bytes_d2h += c.count * eb;
  }
  // 2. Σ g² per chunk as each lands.
  const auto sum_chunk = [this, host, &deadline](std::size_t index) {
    const chunk_ref& c = chunks[index];
    await(*chunk_events[index], deadline, "the grads (the work that makes them, then their copy)");
    const param_state& p = groups[c.group].params[c.param];
    const std::size_t eb = dtype_bytes(p.desc.dtype);
    partial[index] = detail::grad_sum_squares(kernel, host + p.grad_offset + c.offset * eb,
                                              p.desc.dtype, c.count);
  };
  for (auto& [node, pool] : pools) {
    const auto* mine = &chunks_by_node[node];
    pool->start(mine->size(),
                [&, mine](std::size_t task, std::size_t) { sum_chunk((*mine)[task]); });
  }
  std::exception_ptr failure = nullptr;
  for (auto& [node, pool] : pools) {
    try {
      pool->wait();
    } catch (...) {
      failure = failure ? failure : std::current_exception();
    }
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const device_timeout& e) {
      // The work stays queued (the next step's copies run after it): nothing to settle.
      throw timed_out("cpu", e);
    } catch (const device_error& e) {
      throw failed_before_update("cpu", "copying the grads to the host", e);
    }
  }
  totals.grad_seconds += seconds_since(grads_start);
  std::vector<adam_scalars> scalars;
  if (!judge_grads(result, scalars)) {
    return result;
  }

  // 3. Update each chunk in place, then send its params up while the next one updates.
  const auto update_start = clock_type::now();
  const auto update_chunk = [&, host](std::size_t index, std::size_t slot_hint) {
    const chunk_ref& c = chunks[index];
    param_state& p = groups[c.group].params[c.param];
    const std::size_t eb = dtype_bytes(p.desc.dtype);
    float* master = p.master_p() + c.offset;
    detail::adam_update(kernel, master, p.moments_m() + c.offset, p.moments_v() + c.offset,
                        host + p.grad_offset + c.offset * eb, p.desc.dtype, c.count,
                        scalars[c.group]);
    void* dst = static_cast<unsigned char*>(p.desc.param) + c.offset * eb;
    if (p.desc.param_on_host) {
      detail::store_params(kernel, master, dst, p.desc.dtype, c.count);
      return;
    }
    if (p.desc.dtype == param_dtype::f32) {
      dev.copy_async(dst, master, c.count * eb, copy_kind::h2d, h2d);
      return;
    }
    const std::size_t slot = slot_hint % ring.size();
    const std::lock_guard lock(ring_mutex[slot]);
    try {
      ring_events[slot]->synchronize();  // its previous chunk has left
    } catch (const device_error&) {
      // An earlier upload failed: the h2d stream skips what follows until the failure is
      // reported after the batch; the state keeps stepping, and the params are re-sent.
    }
    detail::store_params(kernel, master, ring[slot].data(), p.desc.dtype, c.count);
    dev.copy_async(dst, ring[slot].data(), c.count * eb, copy_kind::h2d, h2d);
    h2d.record(*ring_events[slot]);
  };
  std::vector<std::size_t> turns(threads, 0);  // each worker's own count
  std::size_t pool_base = 0;
  for (auto& [node, pool] : pools) {
    const auto* mine = &chunks_by_node[node];
    const std::size_t base = pool_base;
    pool->start(mine->size(), [&, mine, base](std::size_t task, std::size_t worker) {
      // Each worker of each pool has its own pair of ring slots, used in turn.
      update_chunk((*mine)[task], 2 * (base + worker) + turns[base + worker]++ % 2);
    });
    pool_base += pool->size();
  }
  for (auto& [node, pool] : pools) {
    pool->wait();  // the kernels do not throw; copy_async throws only for bad arguments
  }
  totals.update_seconds += seconds_since(update_start);
  for (auto& g : groups) {
    ++g.steps;
  }
  result.applied = true;
  for (const auto& c : chunks) {
    const auto& desc = groups[c.group].params[c.param].desc;
    totals.bytes_h2d += desc.param_on_host ? 0 : c.count * dtype_bytes(desc.dtype);
  }
  // The state has stepped; a failed upload leaves the device params behind the master
  // weights, and they are re-sent before the next use (step(), sync_params(), load()).
  try {
    h2d.synchronize();
  } catch (const device_error& e) {
    params_stale = true;
    settle_device();
    // Events recorded after the failure carry it until recorded again on a healthy stream.
    for (auto& e2 : ring_events) {
      h2d.record(*e2);
    }
    settle_device();
    throw adam_step_error(
        "offload_adam::step (cpu mode): the step was applied to the state (step " +
            std::to_string(groups.front().steps) +
            " of group 0), but sending the params to the device failed; the device params lag "
            "the master weights until sync_params() or the next step() re-sends them: " +
            e.what(),
        adam_step_error::outcome::applied);
  }
  return result;
}

adam_step_result offload_adam::impl::run_streamed_step(adam_step_result result) {
  stream& compute = dev.compute_stream();
  // The norm pass on the device, then one host sync for the verdict.
  try {
    for (const auto& c : chunks) {
      const param_state& p = groups[c.group].params[c.param];
      const std::size_t eb = dtype_bytes(p.desc.dtype);
      device_side->sum_squares(compute, c.index,
                               static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb,
                               p.desc.dtype, c.count);
    }
    if (const step_deadline deadline = deadline_after(options.device_timeout_s); deadline) {
      compute.record(*compute_done);
      await(*compute_done, deadline, "the grads (the work that makes them, then the norm pass)");
    }
    device_side->collect(compute, partial);
  } catch (const device_timeout& e) {
    throw timed_out("streamed", e);  // the work stays queued; the next step runs after it
  } catch (const device_error& e) {
    throw failed_before_update("streamed", "the grad norm pass on the device", e);
  }
  std::vector<adam_scalars> scalars;
  if (!judge_grads(result, scalars)) {
    return result;
  }
  std::fill(undo_chunk.begin(), undo_chunk.end(), chunks.size());
  std::fill(written_back.begin(), written_back.end(), 0);
  std::optional<std::size_t> acquired;
  try {
    for (const auto& c : chunks) {
      // The chunk's undo slot is free once its previous chunk is surely in its tier copy.
      if (const std::size_t previous = undo_chunk[c.index % undo_chunk.size()];
          previous < chunks.size()) {
        chunk_events[previous]->synchronize();  // throws when its write-back failed
      }
      const staged_step& staged = scheduler->acquire(c.index);
      acquired = c.index;
      param_state& p = groups[c.group].params[c.param];
      const std::size_t eb = dtype_bytes(p.desc.dtype);
      auto* master = static_cast<float*>(staged.pointer(chunk_buffers[c.index][0]));
      auto* m = static_cast<float*>(staged.pointer(chunk_buffers[c.index][1]));
      auto* v = static_cast<float*>(staged.pointer(chunk_buffers[c.index][2]));
      const void* grad = static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb;
      void* param = static_cast<unsigned char*>(p.desc.param) + c.offset * eb;
      save_undo(c, staged.compute(), master, m, v);
      device_side->update(staged.compute(), master, m, v, grad, param, p.desc.dtype, c.count,
                          scalars[c.group]);
      acquired.reset();
      scheduler->release(c.index, true);
      // After the write-back the release enqueued (the d2h stream runs in order).
      dev.d2h_stream().record(*chunk_events[c.index]);
      written_back[c.index] = 1;
    }
    // The step returns only once it is in the tiers: a write-back that failed later would
    // otherwise be lost with the staging the next failure discards.
    if (trust_writeback_events) {
      chunk_events[chunks.size() - 1]->synchronize();
    } else {
      scheduler->flush();
    }
    compute.synchronize();
  } catch (const device_error& e) {
    recover_streamed(std::move(result), scalars, acquired, e.what());
  }
  for (auto& g : groups) {
    ++g.steps;
  }
  result.applied = true;
  return result;
}

// Enqueues the snapshot of chunk @p c's staged pre-step state (@p master, @p m, @p v in HBM)
// into its undo slot on @p on, the stream its kernel runs on: ordered after the fetch and
// before the kernel without a host wait. The caller made sure the slot is free.
void offload_adam::impl::save_undo(const chunk_ref& c, stream& on, const float* master,
                                   const float* m, const float* v) {
  const std::size_t slot = c.index % undo_chunk.size();
  float* out = undo_slot(slot);
  const std::size_t bytes = c.count * sizeof(float);
  dev.copy_async(out, master, bytes, copy_kind::d2d, on);
  dev.copy_async(out + largest_chunk, m, bytes, copy_kind::d2d, on);
  dev.copy_async(out + 2 * largest_chunk, v, bytes, copy_kind::d2d, on);
  on.record(*undo_events[slot]);
  undo_chunk[slot] = c.index;
}

// Copies each (chunk, slot) of @p restore from its HBM undo slot back to the chunk's tier
// copy (D2H, the device idle); false (with the reason) when a copy fails, the slots intact.
bool offload_adam::impl::restore_from_undo(
    const std::vector<std::pair<std::size_t, std::size_t>>& restore, std::string& failure) {
  if (restore.empty()) {
    return true;
  }
  stream& d2h = dev.d2h_stream();
  try {
    for (const auto& [index, slot] : restore) {
      const chunk_ref& c = chunks[index];
      const param_state& p = groups[c.group].params[c.param];
      const float* in = undo_slot(slot);
      const std::size_t bytes = c.count * sizeof(float);
      dev.copy_async(p.master_p() + c.offset, in, bytes, copy_kind::d2h, d2h);
      dev.copy_async(p.moments_m() + c.offset, in + largest_chunk, bytes, copy_kind::d2h, d2h);
      dev.copy_async(p.moments_v() + c.offset, in + 2 * largest_chunk, bytes, copy_kind::d2h, d2h);
    }
    d2h.synchronize();
  } catch (const device_error& e) {
    failure = e.what();
    settle_device();
    return false;
  }
  return true;
}

void offload_adam::impl::recover_streamed(adam_step_result result,
                                          const std::vector<adam_scalars>& scalars,
                                          std::optional<std::size_t> acquired,
                                          const std::string& failure) {
  // 1. Let the scheduler drop what it staged and the device go idle.
  if (acquired) {
    try {
      scheduler->release(*acquired, false);
    } catch (const std::exception& e) {
      detail::log(log_level::debug, std::string("offload_adam: recovery: ") + e.what());
    }
  }
  try {
    scheduler->flush();
  } catch (const std::exception& e) {
    detail::log(log_level::debug, std::string("offload_adam: recovery: ") + e.what());
  }
  settle_device();
  // 2. The chunks whose write-back surely landed hold the step in their tier copy.
  std::vector<char> done(chunks.size(), 0);
  std::size_t done_count = 0;
  if (trust_writeback_events) {
    for (const auto& c : chunks) {
      if (written_back[c.index] == 0) {
        continue;
      }
      try {
        chunk_events[c.index]->synchronize();
        done[c.index] = 1;
        ++done_count;
      } catch (const device_error&) {
      }
    }
  }
  // 3. The others go back to their pre-step state: those whose snapshot ran have it in the
  // HBM ring (a slot is reused only after its chunk's write-back landed) and are copied back;
  // a snapshot that did not run (its event failed) means the stream had failed before it, so
  // the chunk's kernel and write-back, ordered after it, did not run either; chunks never
  // staged were never written.
  std::vector<std::pair<std::size_t, std::size_t>> restore;
  for (std::size_t slot = 0; slot < undo_chunk.size(); ++slot) {
    const std::size_t index = undo_chunk[slot];
    if (index >= chunks.size() || done[index] != 0) {
      continue;
    }
    try {
      undo_events[slot]->synchronize();
      restore.emplace_back(index, slot);
    } catch (const device_error&) {
    }
  }
  const std::string where = "offload_adam::step (streamed mode): " + failure + "; ";
  std::vector<std::size_t> rest;
  for (const auto& c : chunks) {
    if (done[c.index] == 0) {
      rest.push_back(c.index);
    }
  }
  // A failed restore is a second fault: the step is pending, and its completion retries the
  // restore from the same slots first.
  if (std::string restore_failure; !restore_from_undo(restore, restore_failure)) {
    pending = pending_step{std::move(rest), scalars, restore, std::move(result)};
    params_stale = true;
    throw adam_step_error(
        where + std::to_string(done_count) + " of " + std::to_string(chunks.size()) +
            " chunks had been written back and restoring the others from the HBM undo copies "
            "failed (" +
            restore_failure +
            "); the step is pending: the next step() restores them and completes it from the "
            "grads on the device, which must not change before then",
        adam_step_error::outcome::pending);
  }
  // The kernels wrote the device params of every chunk they ran: derive them from the state.
  const auto resend = [this](std::string& text) {
    std::string upload_failure;
    if (try_upload_params(upload_failure)) {
      text += "the device params were re-sent";
    } else {
      text += "sending the params failed too (" + upload_failure +
              "), so the device params lag the master weights until sync_params() or the next "
              "step() re-sends them";
    }
  };
  if (done_count == 0) {
    std::string text = where +
                       "no chunk's write-back had surely landed, so the step was rolled back "
                       "(not applied) from the undo copies: the state is as before; call step() "
                       "again once the fault is gone; ";
    resend(text);
    throw adam_step_error(text, adam_step_error::outcome::not_applied);
  }
  // 4. Complete the step on the host for the chunks still at their pre-step state.
  // One try: a failure now is a second fault, and the pending step survives it.
  std::string host_failure;
  if (finish_on_host(rest, scalars, host_failure)) {
    for (auto& g : groups) {
      ++g.steps;
    }
    std::string text = where + std::to_string(done_count) + " of " + std::to_string(chunks.size()) +
                       " chunks had been written back, so the step was completed on the host "
                       "for the other " +
                       std::to_string(rest.size()) + " and is applied (do not repeat it); ";
    resend(text);
    throw adam_step_error(text, adam_step_error::outcome::applied);
  }
  pending = pending_step{std::move(rest), scalars, {}, std::move(result)};
  params_stale = true;
  throw adam_step_error(
      where + std::to_string(done_count) + " of " + std::to_string(chunks.size()) +
          " chunks had been written back and completing the others failed (" + host_failure +
          "); the step is pending: the next step() completes it from the "
          "grads on the device, which must not change before then",
      adam_step_error::outcome::pending);
}

// Copies the grads of chunks @p rest to the host and runs their update there; false (with
// the reason) when the copy fails, the state then untouched.
bool offload_adam::impl::finish_on_host(const std::vector<std::size_t>& rest,
                                        const std::vector<adam_scalars>& scalars,
                                        std::string& failure) {
  stream& d2h = dev.d2h_stream();
  auto* host = static_cast<unsigned char*>(grads_host.data());
  try {
    dev.compute_stream().record(*compute_done);
    d2h.wait(*compute_done);
    for (const std::size_t index : rest) {
      const chunk_ref& c = chunks[index];
      const param_state& p = groups[c.group].params[c.param];
      const std::size_t eb = dtype_bytes(p.desc.dtype);
      dev.copy_async(host + p.grad_offset + c.offset * eb,
                     static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb, c.count * eb,
                     copy_kind::d2h, d2h);
    }
    d2h.synchronize();
  } catch (const device_error& e) {
    failure = e.what();
    settle_device();
    return false;
  }
  for (const std::size_t index : rest) {
    const chunk_ref& c = chunks[index];
    param_state& p = groups[c.group].params[c.param];
    const std::size_t eb = dtype_bytes(p.desc.dtype);
    detail::adam_update(kernel, p.master_p() + c.offset, p.moments_m() + c.offset,
                        p.moments_v() + c.offset, host + p.grad_offset + c.offset * eb,
                        p.desc.dtype, c.count, scalars[c.group]);
  }
  return true;
}

adam_step_result offload_adam::impl::complete_pending() {
  pending_step& waiting = *pending;
  std::string failure;
  if (restore_from_undo(waiting.restore, failure)) {
    waiting.restore.clear();
  }
  if (!waiting.restore.empty() || !finish_on_host(waiting.chunks, waiting.scalars, failure)) {
    throw adam_step_error("offload_adam::step: completing the pending step failed again (" +
                              failure +
                              "); it is still pending: call step() again once the fault is gone",
                          adam_step_error::outcome::pending);
  }
  for (auto& g : groups) {
    ++g.steps;
  }
  adam_step_result result = std::move(waiting.result);
  result.applied = true;
  pending.reset();
  if (std::string upload_failure; !try_upload_params(upload_failure)) {
    throw adam_step_error(
        "offload_adam::step: the pending step is now complete and applied (do not repeat "
        "it), but sending the params failed, so they lag the master weights until "
        "sync_params() or the next step() re-sends them: " +
            upload_failure,
        adam_step_error::outcome::applied);
  }
  return result;
}

adam_step_error offload_adam::impl::timed_out(const char* in_mode, const device_timeout& e) const {
  return adam_step_error(std::string("offload_adam::step (") + in_mode + " mode): " + e.what() +
                             " for " + detail::number(options.device_timeout_s) +
                             " s (device_timeout_s), so the step was not applied and the state "
                             "is as before; the work stays queued, and the next step() waits "
                             "for it first",
                         adam_step_error::outcome::not_applied);
}

// A failure of the work a step waits for before it changes any state: the state is untouched;
// the copies still queued are let finish (and their failures taken) before reporting.
adam_step_error offload_adam::impl::failed_before_update(const char* in_mode, const char* what,
                                                         const device_error& e) {
  settle_device();
  return adam_step_error(std::string("offload_adam::step (") + in_mode + " mode): " + what +
                             " failed, so the step was not applied and the state is as before; "
                             "call step() again once the fault is gone: " +
                             e.what(),
                         adam_step_error::outcome::not_applied);
}

// Waits for the device to go idle and takes (logs) any failure it still holds, so that the
// next work runs on healthy streams.
void offload_adam::impl::settle_device() noexcept {
  try {
    dev.synchronize();
  } catch (const std::exception& e) {
    detail::log(log_level::debug, std::string("offload_adam: settling the device: ") + e.what());
  }
}

bool offload_adam::impl::try_upload_params(std::string& failure) {
  params_stale = true;
  try {
    upload_params();
  } catch (const device_error& e) {
    failure = e.what();
    settle_device();
    return false;
  }
  params_stale = false;
  return true;
}

void offload_adam::impl::resend_stale_params(const char* during) {
  if (!params_stale) {
    return;
  }
  std::string failure;
  if (!try_upload_params(failure)) {
    throw adam_step_error(std::string("offload_adam: ") + during +
                              ": re-sending the params that a failed call left behind the "
                              "master weights failed again, so nothing was done and the state is "
                              "as before; retry once the fault is gone: " +
                              failure,
                          adam_step_error::outcome::not_applied);
  }
}

void offload_adam::impl::upload_params() {
  flush_state();
  stream& h2d = dev.h2d_stream();
  for (auto& g : groups) {
    for (auto& p : g.params) {
      const std::size_t eb = dtype_bytes(p.desc.dtype);
      if (p.desc.param_on_host) {
        detail::store_params(kernel, p.master_p(), p.desc.param, p.desc.dtype, p.desc.elements);
        continue;
      }
      if (p.desc.dtype == param_dtype::f32) {
        dev.copy_async(p.desc.param, p.master_p(), p.desc.elements * eb, copy_kind::h2d, h2d);
        continue;
      }
      // The grads buffer has room for every param in its own dtype.
      auto* staging = static_cast<unsigned char*>(grads_host.data()) + p.grad_offset;
      detail::store_params(kernel, p.master_p(), staging, p.desc.dtype, p.desc.elements);
      dev.copy_async(p.desc.param, staging, p.desc.elements * eb, copy_kind::h2d, h2d);
    }
  }
  h2d.synchronize();
}

// Between steps every tier copy is current (a step returns once its write-backs landed), so
// the flush only drops what was prefetched for the next step: a failed prefetch costs nothing
// but the refetch, and is not the caller's error.
void offload_adam::impl::flush_state() {
  if (!scheduler) {
    return;
  }
  try {
    scheduler->flush();
  } catch (const device_error& e) {
    detail::log(log_level::debug,
                std::string("offload_adam: a prefetch for the next step failed and is dropped: ") +
                    e.what());
    settle_device();
  }
}

offload_adam::offload_adam(device& dev, std::vector<adam_group> groups, adam_options options,
                           placement_policy& placement)
    : impl_(std::make_unique<impl>(dev, std::move(options), placement)) {
  impl& s = *impl_;
  s.validate(groups);
  s.kernel = detail::resolve_kernel(s.options.kernel);
  s.allocate_state(groups);
  s.make_chunks();
  s.choose_mode();
  for (std::size_t i = 0; i < s.chunks.size(); ++i) {
    s.chunk_events.push_back(dev.create_event());
  }
  s.read_initial_params();
  if (s.mode == adam_mode::cpu) {
    s.start_workers();
    bool narrow = false;
    for (const auto& g : s.groups) {
      for (const auto& p : g.params) {
        narrow = narrow || p.desc.dtype != param_dtype::f32;
      }
    }
    if (narrow) {
      const std::size_t slots = 2 * s.threads;
      s.ring_mutex = std::make_unique<std::mutex[]>(slots);
      for (std::size_t i = 0; i < slots; ++i) {
        s.ring.push_back(s.placement.allocate(data_class::staging, s.options.chunk_elements * 2));
        s.register_host(s.ring.back().data(), s.ring.back().size());
        s.ring_events.push_back(dev.create_event());
      }
    }
  } else {
    s.totals.threads = 0;
    s.build_streamed();
  }
  s.totals.mode = s.mode;
  s.totals.mode_reason = s.mode_reason;
  s.totals.kernel = s.kernel;
  detail::log(log_level::info, "offload_adam: " + std::to_string(s.total_elements) + " params in " +
                                   std::to_string(s.chunks.size()) + " chunks, mode " +
                                   std::string(to_string(s.mode)) + " (" + s.mode_reason +
                                   "), kernel " + std::string(to_string(s.kernel)));
}

offload_adam::~offload_adam() = default;

adam_step_result offload_adam::step() {
  impl& s = *impl_;
  const auto start = clock_type::now();
  adam_step_result result;
  try {
    if (s.pending) {
      result = s.complete_pending();
    } else {
      s.resend_stale_params("step");
      result = s.mode == adam_mode::cpu ? s.run_cpu_step(std::move(result))
                                        : s.run_streamed_step(std::move(result));
    }
  } catch (const adam_step_error& e) {
    s.totals.steps += e.applied() ? 1 : 0;
    s.totals.step_seconds_total += seconds_since(start);
    detail::log(log_level::warning, e.what());
    throw;
  }
  result.seconds = seconds_since(start);
  if (result.applied) {
    ++s.totals.steps;
  } else {
    ++s.totals.skipped_steps;
    detail::log(log_level::warning, "offload_adam: " + result.skip_reason);
  }
  s.totals.step_seconds_total += result.seconds;
  s.totals.last_step_seconds = result.seconds;
  return result;
}

const adam_hyper& offload_adam::hyper(std::size_t group) const {
  return impl_->group_at(group).hyper;
}

void offload_adam::set_hyper(std::size_t group, const adam_hyper& hyper) {
  impl_->group_at(group);
  detail::check_hyper(hyper, "group " + std::to_string(group));
  impl_->groups[group].hyper = hyper;
}

void offload_adam::set_lr(double lr) {
  for (std::size_t g = 0; g < impl_->groups.size(); ++g) {
    adam_hyper h = impl_->groups[g].hyper;
    h.lr = lr;
    detail::check_hyper(h, "group " + std::to_string(g));
  }
  for (auto& g : impl_->groups) {
    g.hyper.lr = lr;
  }
}

void offload_adam::sync_params() {
  impl_->resend_stale_params("sync_params");
}

bool offload_adam::params_current() const noexcept {
  return !impl_->params_stale;
}

std::uint64_t offload_adam::step_count(std::size_t group) const {
  return impl_->group_at(group).steps;
}

std::size_t offload_adam::group_count() const noexcept {
  return impl_->groups.size();
}

adam_mode offload_adam::mode() const noexcept {
  return impl_->mode;
}

const std::string& offload_adam::mode_reason() const noexcept {
  return impl_->mode_reason;
}

adam_kernel offload_adam::kernel() const noexcept {
  return impl_->kernel;
}

void offload_adam::save(const std::filesystem::path& path) const {
  if (impl_->pending) {
    throw error("offload_adam::save: " + path.string() +
                ": a failed step is pending (half done); step() completes it first");
  }
  impl_->flush_state();
  detail::save_checkpoint(path, impl_->groups, impl_->options.chunk_elements);
}

void offload_adam::load(const std::filesystem::path& path) {
  impl_->flush_state();
  detail::load_checkpoint(path, impl_->groups);
  impl_->pending.reset();
  if (std::string failure; !impl_->try_upload_params(failure)) {
    throw adam_step_error("offload_adam::load: " + path.string() +
                              ": the state was loaded, but sending the params failed, so they "
                              "lag the master weights until sync_params() or the next step() "
                              "re-sends them: " +
                              failure,
                          adam_step_error::outcome::applied);
  }
}

adam_metrics offload_adam::metrics() const {
  adam_metrics m = impl_->totals;
  if (impl_->scheduler) {
    const scheduler_metrics sm = impl_->scheduler->metrics();
    m.bytes_h2d = sm.bytes_in;
    m.bytes_d2h = sm.bytes_out;
    m.hbm_staging_peak_bytes = sm.hbm_staging_peak_bytes;
  }
  return m;
}

page_residency offload_adam::state_residency(data_class cls) const {
  if (cls != data_class::master_params && cls != data_class::optimizer_state) {
    throw error(
        "offload_adam::state_residency: the state is master_params and "
        "optimizer_state, not " +
        std::string(to_string(cls)));
  }
  page_residency total;
  for (const auto& g : impl_->groups) {
    for (const auto& p : g.params) {
      const tier_allocation& a = cls == data_class::master_params ? p.master : p.moments;
      const page_residency r = where(a.data(), a.size());
      total.page_bytes = r.page_bytes;
      total.total_pages += r.total_pages;
      total.untouched_pages += r.untouched_pages;
      for (const auto& [node, pages] : r.pages_on_node) {
        total.pages_on_node[node] += pages;
      }
    }
  }
  return total;
}

namespace {

std::vector<float> copy_of(const float* p, std::size_t n) {
  return {p, p + n};
}

}  // namespace

std::vector<float> offload_adam::master_weights(std::size_t group, std::size_t param) const {
  const auto& p = impl_->param_at(group, param);
  impl_->flush_state();
  return copy_of(p.master_p(), p.desc.elements);
}

std::vector<float> offload_adam::exp_avg(std::size_t group, std::size_t param) const {
  const auto& p = impl_->param_at(group, param);
  impl_->flush_state();
  return copy_of(p.moments_m(), p.desc.elements);
}

std::vector<float> offload_adam::exp_avg_sq(std::size_t group, std::size_t param) const {
  const auto& p = impl_->param_at(group, param);
  impl_->flush_state();
  return copy_of(p.moments_v(), p.desc.elements);
}

std::string adam_metrics::to_json() const {
  metrics::json_writer w;
  w.begin_object().key("schema_version").value(1).key("adam").begin_object();
  w.key("mode").value(to_string(mode)).key("mode_reason").value(mode_reason);
  w.key("kernel").value(to_string(kernel)).key("threads").value(std::uint64_t{threads});
  w.key("params").value(params).key("chunks").value(chunks);
  w.key("steps").value(steps).key("skipped_steps").value(skipped_steps);
  w.key("step_seconds_total").value(step_seconds_total);
  w.key("last_step_seconds").value(last_step_seconds);
  w.key("grad_seconds").value(grad_seconds).key("update_seconds").value(update_seconds);
  w.key("bytes_d2h").value(bytes_d2h).key("bytes_h2d").value(bytes_h2d);
  w.key("state_bytes").value(state_bytes);
  w.key("hbm_staging_peak_bytes").value(hbm_staging_peak_bytes);
  w.key("hbm_undo_bytes").value(hbm_undo_bytes);
  w.end_object().end_object();
  return w.str();
}

}  // namespace tierflow
