#include "tierflow/session.hpp"

#include <atomic>
#include <exception>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

namespace {

struct weight_info {
  std::string name;
  std::size_t bytes = 0;
  void* host = nullptr;
  std::size_t block = 0;
  std::string tier;  // where the session allocated it; empty: the caller's memory
};

std::size_t element_bytes(param_dtype dtype) {
  return dtype == param_dtype::f32 ? 4 : 2;
}

std::string weight_name(const session_weight& w, std::size_t block, std::size_t index) {
  return w.name.empty() ? "block" + std::to_string(block) + ".w" + std::to_string(index) : w.name;
}

}  // namespace

// The session is its optimizer's write guard: the optimizer calls it before it writes a
// weight's tier copy.
struct session::impl final : param_write_guard {
  // Destroyed in reverse: the optimizer first (it may still write the tier copies), then the
  // scheduler (it waits for its copies), then the weights it allocated, the placement, the device.
  std::shared_ptr<device> dev;
  topology topo;
  session_options options;
  placement_policy placement;
  std::vector<tier_allocation> owned;
  std::vector<weight_info> weights;
  std::vector<std::vector<std::size_t>> blocks;     // the weights of each block
  std::unordered_map<const void*, std::size_t> at;  // tier copy -> weight (read-only once set)
  std::unique_ptr<prefetch_scheduler> sched;
  std::vector<std::unique_ptr<offload_adam>> opts;  // the last made is optimizer()

  // The pass: the plan step held, the one expected next (none: any), whether one is open and
  // the furthest step it reached (read by may_write_now() from autograd threads).
  std::optional<std::size_t> acquired;
  std::optional<std::size_t> next;
  std::atomic<bool> open{false};
  std::atomic<std::size_t> reached{0};
  std::uint64_t passes = 0;

  impl(std::shared_ptr<device> d, topology t, session_options o)
      : dev(std::move(d)),
        topo(std::move(t)),
        options(std::move(o)),
        placement(topo, options.placement) {}

  [[nodiscard]] std::size_t steps() const { return 2 * blocks.size(); }
  void check_weight(std::size_t w) const {
    TIERFLOW_EXPECTS(w < weights.size(), "session: weight " + std::to_string(w) +
                                             " out of range (" + std::to_string(weights.size()) +
                                             " weights)");
  }
  prefetch_scheduler& scheduler() const {
    TIERFLOW_EXPECTS(sched != nullptr, "session: no weight plan yet (set_blocks)");
    return *sched;
  }

  void build(std::vector<std::vector<session_weight>> in,
             const std::function<void(std::size_t, void*)>& initialize);
  const staged_step& stage(std::size_t step);
  void release();
  void end_pass();
  void resolve(std::vector<adam_group>& groups) const;

  void before_writes() override { end_pass(); }
  bool may_write_now(const void* param) override {
    const auto it = at.find(param);
    if (it == at.end() || !open.load()) {
      return true;
    }
    // Backward goes from the last block down: once it reached this block's backward step,
    // nothing of the pass stages the block again, and its staging copy has landed.
    const std::size_t backward_step = steps() - 1 - weights[it->second].block;
    return reached.load() >= backward_step;
  }
};

void session::impl::build(std::vector<std::vector<session_weight>> in,
                          const std::function<void(std::size_t, void*)>& initialize) {
  schedule_plan plan = session_plan(in);  // checks the blocks first
  for (std::size_t b = 0; b < in.size(); ++b) {
    blocks.emplace_back();
    for (std::size_t j = 0; j < in[b].size(); ++j) {
      session_weight& w = in[b][j];
      std::string tier;
      if (w.data == nullptr) {
        owned.push_back(placement.allocate(data_class::params, w.bytes));
        w.data = owned.back().data();
        tier = owned.back().tier();
      }
      const std::size_t id = weights.size();
      plan.buffers[id].data = w.data;
      blocks.back().push_back(id);
      at.emplace(w.data, id);
      weights.push_back({plan.buffers[id].name, w.bytes, w.data, b, tier});
      if (initialize) {
        initialize(id, w.data);
      }
    }
  }
  scheduler_options so;
  so.window = options.window;
  so.hbm_budget_bytes = options.hbm_budget_bytes;
  so.adaptive = options.adaptive;
  so.trace = options.trace;
  // Each pass ends with the optimizer rewriting the tier copies: what the last steps would
  // stage of the next pass would be dropped unused.
  so.prefetch_across_iterations = false;
  sched = std::make_unique<prefetch_scheduler>(*dev, std::move(plan), so);
}

const staged_step& session::impl::stage(std::size_t step) {
  const staged_step& s = sched->acquire(step);
  acquired = step;
  next = (step + 1) % steps();
  open.store(true);
  if (step > reached.load()) {
    reached.store(step);
  }
  return s;
}

void session::impl::release() {
  if (!acquired) {
    return;
  }
  const std::size_t step = *acquired;
  acquired.reset();
  sched->release(step, false);
  if (step + 1 == steps()) {
    end_pass();  // block 0's backward: the pass is over
  }
}

void session::impl::end_pass() {
  if (sched == nullptr || !open.load()) {
    return;
  }
  std::exception_ptr failure;
  try {
    release();
  } catch (...) {
    failure = std::current_exception();
  }
  if (!open.load()) {
    return;  // release() ended it (block 0's backward)
  }
  // restart() writes nothing back (the plan only reads) and forgets the position even when a
  // failure above left work behind: the next pass starts clean.
  sched->restart();
  next.reset();
  reached.store(0);
  open.store(false);
  ++passes;
  if (failure) {
    std::rethrow_exception(failure);
  }
}

void session::impl::resolve(std::vector<adam_group>& groups) const {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (auto& p : groups[g].params) {
      if (!p.weight) {
        continue;
      }
      check_weight(*p.weight);
      const weight_info& w = weights[*p.weight];
      const std::size_t bytes = p.elements * element_bytes(p.dtype);
      TIERFLOW_EXPECTS(
          p.elements > 0 && bytes / element_bytes(p.dtype) == p.elements && bytes == w.bytes,
          "session: group " + std::to_string(g) + " param '" + p.name + "' names weight '" +
              w.name + "' of " + std::to_string(w.bytes) + " bytes, but is " +
              std::to_string(p.elements) + " elements of " +
              std::to_string(element_bytes(p.dtype)) + " bytes");
      p.param = w.host;
      p.param_on_host = true;
    }
  }
}

schedule_plan session_plan(const std::vector<std::vector<session_weight>>& blocks) {
  TIERFLOW_EXPECTS(!blocks.empty(), "session: the weight plan has no blocks");
  std::set<std::string> names;
  schedule_plan plan;
  std::vector<std::vector<buffer_id>> uses;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    TIERFLOW_EXPECTS(!blocks[b].empty(), "session: block " + std::to_string(b) + " has no weights");
    uses.emplace_back();
    for (std::size_t j = 0; j < blocks[b].size(); ++j) {
      const session_weight& w = blocks[b][j];
      std::string name = weight_name(w, b, j);
      TIERFLOW_EXPECTS(w.bytes > 0, "session: weight '" + name + "' has 0 bytes");
      TIERFLOW_EXPECTS(names.insert(name).second, "session: two weights are named '" + name + "'");
      uses.back().push_back(plan.add_buffer({std::move(name), w.data, w.bytes, w.resident, false}));
    }
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    plan.add_step({"fwd" + std::to_string(b), uses[b], {}});
  }
  for (std::size_t b = blocks.size(); b-- > 0;) {
    plan.add_step({"bwd" + std::to_string(b), uses[b], {}});
  }
  return plan;
}

session::session(std::shared_ptr<device> dev, session_options options)
    : session(dev, topology::discover(), std::move(options)) {}

session::session(std::shared_ptr<device> dev, topology topo, session_options options) {
  TIERFLOW_EXPECTS(dev != nullptr, "session: the device is null");
  impl_ = std::make_unique<impl>(std::move(dev), std::move(topo), std::move(options));
}

session::~session() {
  try {
    impl_->opts.clear();
    impl_->end_pass();
  } catch (const std::exception& e) {
    detail::log(log_level::warning,
                std::string("session: ending the pass at destruction: ") + e.what());
  }
}

device& session::dev() const noexcept {
  return *impl_->dev;
}

const std::shared_ptr<device>& session::shared_device() const noexcept {
  return impl_->dev;
}

const topology& session::topo() const noexcept {
  return impl_->topo;
}

placement_policy& session::placement() noexcept {
  return impl_->placement;
}

const session_options& session::options() const noexcept {
  return impl_->options;
}

void session::set_blocks(std::vector<std::vector<session_weight>> blocks,
                         const std::function<void(std::size_t, void*)>& initialize) {
  TIERFLOW_EXPECTS(impl_->sched == nullptr, "session: the weight plan is set already");
  try {
    impl_->build(std::move(blocks), initialize);
  } catch (...) {
    // Nothing half-built stays: the call may be made again.
    impl_->sched.reset();
    impl_->weights.clear();
    impl_->blocks.clear();
    impl_->at.clear();
    impl_->owned.clear();
    throw;
  }
}

std::size_t session::block_count() const noexcept {
  return impl_->blocks.size();
}

std::size_t session::weight_count() const noexcept {
  return impl_->weights.size();
}

std::size_t session::block_size(std::size_t block) const {
  TIERFLOW_EXPECTS(block < impl_->blocks.size(),
                   "session: block " + std::to_string(block) + " out of range (" +
                       std::to_string(impl_->blocks.size()) + " blocks)");
  return impl_->blocks[block].size();
}

std::size_t session::weight(std::size_t block, std::size_t index) const {
  TIERFLOW_EXPECTS(block < impl_->blocks.size() && index < impl_->blocks[block].size(),
                   "session: block " + std::to_string(block) + " weight " + std::to_string(index) +
                       " out of range");
  return impl_->blocks[block][index];
}

std::size_t session::block_of(std::size_t weight) const {
  impl_->check_weight(weight);
  return impl_->weights[weight].block;
}

void* session::weight_host(std::size_t weight) const {
  impl_->check_weight(weight);
  return impl_->weights[weight].host;
}

std::size_t session::weight_bytes(std::size_t weight) const {
  impl_->check_weight(weight);
  return impl_->weights[weight].bytes;
}

void* session::resident_pointer(std::size_t weight) const {
  impl_->check_weight(weight);
  return impl_->scheduler().resident_pointer(static_cast<buffer_id>(weight));
}

const std::string& session::weight_tier(std::size_t weight) const {
  impl_->check_weight(weight);
  return impl_->weights[weight].tier;
}

const std::string& session::weight_name(std::size_t weight) const {
  impl_->check_weight(weight);
  return impl_->weights[weight].name;
}

const staged_step& session::acquire(std::size_t block, pass_direction direction) {
  impl& s = *impl_;
  s.scheduler();
  const std::size_t n = s.blocks.size();
  TIERFLOW_EXPECTS(block < n, "session: block " + std::to_string(block) + " out of range (" +
                                  std::to_string(n) + " blocks)");
  const std::size_t step = direction == pass_direction::forward ? block : 2 * n - 1 - block;
  s.release();
  if (s.next && *s.next != step) {
    // Steps the pass skipped (a block that did not run) go by in order; a pass that went back
    // (a new forward before the backward, or after an exception) starts over.
    const std::size_t ahead = (step + 2 * n - *s.next) % (2 * n);
    if (step < *s.next || ahead > n) {
      s.end_pass();
    } else {
      while (s.next && *s.next != step) {
        s.stage(*s.next);
        s.release();
      }
    }
  }
  return s.stage(step);
}

void session::release() {
  impl_->release();
}

void session::end_pass() {
  impl_->end_pass();
}

bool session::pass_open() const noexcept {
  return impl_->open.load();
}

std::uint64_t session::passes() const noexcept {
  return impl_->passes;
}

prefetch_scheduler& session::scheduler() {
  return impl_->scheduler();
}

bool session::has_plan() const noexcept {
  return impl_->sched != nullptr;
}

offload_adam& session::make_optimizer(std::vector<adam_group> groups, adam_options options) {
  impl& s = *impl_;
  s.resolve(groups);
  s.end_pass();  // the constructor reads the params: the tier copies must be current
  auto made =
      std::make_unique<offload_adam>(*s.dev, std::move(groups), std::move(options), s.placement);
  made->set_write_guard(&s);
  s.opts.push_back(std::move(made));
  return *s.opts.back();
}

offload_adam& session::optimizer() {
  TIERFLOW_EXPECTS(!impl_->opts.empty(), "session: no optimizer (make_optimizer)");
  return *impl_->opts.back();
}

bool session::has_optimizer() const noexcept {
  return !impl_->opts.empty();
}

void session::drop_optimizer(const offload_adam& opt) noexcept {
  auto& opts = impl_->opts;
  for (auto it = opts.begin(); it != opts.end(); ++it) {
    if (it->get() == &opt) {
      opts.erase(it);
      return;
    }
  }
}

}  // namespace tierflow
