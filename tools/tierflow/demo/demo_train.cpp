// One training run of the demo's model (demo_train.hpp).
//
// A client of tierflow::session: each iteration is one pass of the session, forward layer
// 0 .. L-1, then backward L-1 .. 0, each layer's weights read from their staging, the compute
// stream doing the math through demo_compute; layer 0's backward ends the pass. Then the
// session's optimizer steps: the grads come down, the update runs in the tier, the new weights
// land in the tier copies (the session guarantees nothing of them is staged or in flight).
#include "demo/demo_train.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "demo/demo_compute.hpp"
#include "demo/demo_model.hpp"
#include "demo/device_buffers.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli::demo {

namespace {

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

// The device memory of a run beside the weights: activations h_0 .. h_{L-1} and y, the batch's
// target, two ping-pong input grads, and the weight grads.
struct layer_buffers {
  std::vector<float*> acts;
  float* target = nullptr;
  float* dh_a = nullptr;
  float* dh_b = nullptr;
  std::vector<float*> grads;
};

layer_buffers allocate_layer_buffers(const demo_options& o, device_buffers& buf) {
  const std::size_t batch_floats = o.batch * o.width;
  layer_buffers b;
  for (std::size_t l = 0; l <= o.layers; ++l) {
    b.acts.push_back(buf.floats(batch_floats));
  }
  b.target = buf.floats(batch_floats);
  b.dh_a = buf.floats(batch_floats);
  b.dh_b = buf.floats(batch_floats);
  for (std::size_t l = 0; l < o.layers; ++l) {
    b.grads.push_back(buf.floats(o.width * o.width));
  }
  return b;
}

// The session of a run: the layers' weights as its blocks, staged `window` layers ahead (the
// reference run: every weight resident in HBM).
session_options demo_session_options(const demo_options& o, bool resident) {
  session_options so;
  so.window = o.window;
  so.trace = !resident;
  so.placement = demo_placement_options(o);
  if (!resident && o.hbm_budget_mib > 0) {
    so.hbm_budget_bytes = static_cast<std::uint64_t>(o.hbm_budget_mib * 1048576.0);
  }
  return so;  // otherwise the scheduler's default: the window's layers, or all of them resident
}

adam_hyper demo_adam_hyper(const demo_options& o) {
  adam_hyper hyper;
  hyper.lr = o.lr;
  hyper.weight_decay = 0.01;
  return hyper;
}

// The session's optimizer over its weights (updated in their tier copies) and the device grads.
offload_adam& make_offload_adam(const demo_options& o, session& sess,
                                const std::vector<float*>& grads) {
  const std::size_t n = o.width * o.width;
  adam_group group;
  group.hyper = demo_adam_hyper(o);
  for (std::size_t l = 0; l < o.layers; ++l) {
    adam_param p;
    p.name = "layer" + std::to_string(l) + ".w";
    p.weight = l;
    p.grad = grads[l];
    p.elements = n;
    group.params.push_back(p);
  }
  adam_options ao;
  ao.mode = checked_adam_mode(o.adam_mode);
  ao.chunk_elements = std::min<std::size_t>(n, o.adam_chunk);
  ao.overlap = checked_adam_overlap(o.overlap);
  ao.state_dtype = checked_state_dtype(o.state_dtype, o.adam_mode);
  return sess.make_optimizer({group}, ao);
}

// The pages of the optimizer's state per class: {class: {"total": pages, "nodes": {...}}}.
json state_pages_of(const offload_adam& adam) {
  json out;
  for (data_class cls : {data_class::master_params, data_class::optimizer_state}) {
    const page_residency r = adam.state_residency(cls);
    json nodes = json::object();
    for (const auto& [node, pages] : r.pages_on_node) {
      nodes[std::to_string(node)] = pages;
    }
    out[std::string(to_string(cls))] = {{"total", r.total_pages}, {"nodes", nodes}};
  }
  return out;
}

// One run's state, in the order it is built and (reversed) torn down: the session (weights,
// scheduler, optimizer) outlives the device buffers; its optimizer goes first, with it.
class trainer {
 public:
  trainer(const demo_options& o, device& dev, const topology& topo, bool resident);
  run_result run(bool quiet);

 private:
  void upload_batch(std::size_t step);
  void forward_pass();
  void backward_pass(bool announce);
  void optimizer_step();
  void log_progress(std::size_t step, clock_type::time_point& batch_start);
  void collect(run_result& result);

  const demo_options& o_;
  device& dev_;
  bool resident_;
  std::mt19937_64 gen_;
  data_set data_;
  session sess_;
  device_buffers buf_;
  layer_buffers layers_;
  std::vector<float> pinned_x_, pinned_t_;  // the batch, host side
  std::unique_ptr<demo_compute> math_;
  offload_adam* adam_ = nullptr;  // the session's
  resident_adam reference_;
  std::vector<double> loss_slot_ = std::vector<double>(1, 0.0);
};

trainer::trainer(const demo_options& o, device& dev, const topology& topo, bool resident)
    : o_(o),
      dev_(dev),
      resident_(resident),
      gen_(o.seed),
      data_(make_data(o, gen_)),
      // train()'s caller owns the device, which outlives the run: a non-owning pointer.
      sess_(std::shared_ptr<device>(std::shared_ptr<device>(), &dev), topo,
            demo_session_options(o, resident)),
      buf_(dev),
      layers_(allocate_layer_buffers(o, buf_)),
      pinned_x_(o.batch * o.width),
      pinned_t_(o.batch * o.width),
      math_(make_compute(dev, o.batch, o.width)) {
  const std::size_t n = o.width * o.width;
  // The weights' tier copies hold the initial weights before the session stages any (the
  // resident run's are uploaded from them when the plan is set).
  const std::vector<std::vector<float>> init = init_weights(o, gen_);
  sess_.set_blocks(demo_blocks(o, resident), [&](std::size_t w, void* host) {
    std::memcpy(host, init[w].data(), init[w].size() * sizeof(float));
  });
  if (resident) {
    reference_.hyper = demo_adam_hyper(o);
    for (std::size_t l = 0; l < o.layers; ++l) {
      reference_.m.push_back(buf_.floats(n));
      reference_.v.push_back(buf_.floats(n));
      math_->zero(dev.compute_stream(), reference_.m.back(), n);
      math_->zero(dev.compute_stream(), reference_.v.back(), n);
    }
  } else {
    adam_ = &make_offload_adam(o, sess_, layers_.grads);
  }
}

// The batch of @p step into HBM on the compute stream, through the pinned host copies.
void trainer::upload_batch(std::size_t step) {
  const std::size_t floats = o_.batch * o_.width;
  const std::size_t b = step % (o_.samples / o_.batch);
  std::memcpy(pinned_x_.data(), data_.x.data() + b * floats, floats * sizeof(float));
  std::memcpy(pinned_t_.data(), data_.t.data() + b * floats, floats * sizeof(float));
  stream& compute = dev_.compute_stream();
  dev_.copy_async(layers_.acts[0], pinned_x_.data(), floats * sizeof(float), copy_kind::h2d,
                  compute);
  dev_.copy_async(layers_.target, pinned_t_.data(), floats * sizeof(float), copy_kind::h2d,
                  compute);
}

void trainer::forward_pass() {
  for (std::size_t l = 0; l < o_.layers; ++l) {
    const staged_step& st = sess_.acquire(l, pass_direction::forward);
    const auto* wl = static_cast<const float*>(st.pointer(static_cast<buffer_id>(l)));
    const bool last = l + 1 == o_.layers;
    math_->forward(st.compute(), layers_.acts[l], wl, layers_.acts[l + 1], !last);
    if (last) {
      math_->loss(st.compute(), layers_.acts[l + 1], layers_.target, layers_.dh_a,
                  loss_slot_.data());
    }
    sess_.release();
  }
}

// @p announce: each layer's grad is final once its backward is enqueued, and grad_ready()
// starts its (speculative) update while the layers below run theirs.
void trainer::backward_pass(bool announce) {
  for (std::size_t k = 0; k < o_.layers; ++k) {
    const std::size_t l = o_.layers - 1 - k;
    const staged_step& st = sess_.acquire(l, pass_direction::backward);
    const auto* wl = static_cast<const float*>(st.pointer(static_cast<buffer_id>(l)));
    float* dz = k % 2 == 0 ? layers_.dh_a : layers_.dh_b;
    float* dh_next = k % 2 == 0 ? layers_.dh_b : layers_.dh_a;
    math_->backward(st.compute(), dz, l + 1 != o_.layers ? layers_.acts[l + 1] : nullptr,
                    layers_.acts[l], wl, layers_.grads[l], l == 0 ? nullptr : dh_next);
    if (announce) {
      adam_->grad_ready(0, l);
    }
    sess_.release();  // block 0's ends the pass: nothing staged, the tier copies current
  }
}

void trainer::optimizer_step() {
  if (resident_) {
    std::vector<float*> params;
    for (std::size_t l = 0; l < o_.layers; ++l) {
      params.push_back(static_cast<float*>(sess_.resident_pointer(l)));
    }
    math_->adam_step(dev_.compute_stream(), reference_, params, layers_.grads, o_.width * o_.width);
    dev_.compute_stream().synchronize();
  } else {
    const auto r = adam_->step();
    if (!r.applied) {
      throw error("demo: the optimizer skipped a step: " + r.skip_reason);
    }
  }
}

// A progress line on stderr, its step time averaged since @p batch_start (which moves on).
void trainer::log_progress(std::size_t step, clock_type::time_point& batch_start) {
  const auto m = sess_.scheduler().metrics();
  const double dt = std::chrono::duration<double>(clock_type::now() - batch_start).count() /
                    static_cast<double>(o_.log_every);
  batch_start = clock_type::now();
  const double adam_ms = adam_ ? 1e3 * adam_->metrics().last_step_seconds : 0.0;
  std::fprintf(stderr,
               "step %5zu  loss %.6f  step %.1f ms  stall %.1f %%  h2d %.2f GB/s  adam %.1f "
               "ms\n",
               step + 1, loss_slot_[0], dt * 1e3, 100.0 * m.stall_fraction, m.h2d.achieved_gbps(),
               adam_ms);
}

run_result trainer::run(bool quiet) {
  run_result result;
  const auto start = clock_type::now();
  auto batch_start = clock_type::now();
  stream& compute = dev_.compute_stream();
  const auto since = [](clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
  };
  const bool overlap = adam_ && checked_adam_overlap(o_.overlap) != adam_overlap::none;
  for (std::size_t step = 0; step < o_.steps; ++step) {
    const auto step_start = clock_type::now();
    const bool announce = overlap && step % 2 == 0;  // odd steps plain: the same run's baseline
    upload_batch(step);
    forward_pass();
    backward_pass(announce);
    compute.synchronize();  // the backward pass is over: what follows is the exposed step
    result.forward_backward_seconds.push_back(since(step_start));
    const auto adam_start = clock_type::now();
    optimizer_step();
    compute.synchronize();
    result.exposed_seconds.push_back(since(adam_start));
    result.announced.push_back(announce ? 1 : 0);
    result.losses.push_back(loss_slot_[0]);
    result.step_seconds.push_back(since(step_start));
    ++result.steps;
    if (!quiet && o_.log_every > 0 && (step + 1) % o_.log_every == 0) {
      log_progress(step, batch_start);
    }
  }
  result.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  sess_.end_pass();
  collect(result);
  return result;
}

// The final weights (copied down from HBM for the resident run), the metrics and placement.
void trainer::collect(run_result& result) {
  const std::size_t n = o_.width * o_.width;
  stream& compute = dev_.compute_stream();
  for (std::size_t l = 0; l < o_.layers; ++l) {
    if (resident_) {  // device memory: copied down
      result.final_weights.emplace_back(n);
      dev_.copy_async(result.final_weights.back().data(), sess_.resident_pointer(l),
                      n * sizeof(float), copy_kind::d2h, compute);
    } else {
      const auto* src = static_cast<const float*>(sess_.weight_host(l));
      result.final_weights.emplace_back(src, src + n);
    }
  }
  compute.synchronize();
  prefetch_scheduler& sched = sess_.scheduler();
  result.sched = sched.metrics();
  result.sched_json = sched.snapshot_json();
  result.prometheus = sched.prometheus_text();
  result.trace = sched.trace_json();
  if (adam_) {
    result.adam = adam_->metrics();
    result.state_pages = state_pages_of(*adam_);
  }
  result.placement = sess_.placement().snapshot();
}

}  // namespace

overlap_summary summarize_overlap(const demo_options& o, const run_result& run) {
  overlap_summary s;
  s.overlap = o.overlap;
  const std::size_t first = run.step_seconds.size() >= 4 ? 2 : 0;  // the warm-up left out
  double fb = 0, exposed = 0, plain = 0, iteration = 0, plain_iteration = 0;
  for (std::size_t i = first; i < run.step_seconds.size(); ++i) {
    fb += run.forward_backward_seconds[i];
    // With overlap none every step is plain and counts as both: exposed == plain.
    const bool overlapped = run.announced[i] != 0 || o.overlap == "none";
    const bool is_plain = run.announced[i] == 0;
    if (overlapped) {
      exposed += run.exposed_seconds[i];
      iteration += run.step_seconds[i];
      ++s.overlapped_steps;
    }
    if (is_plain) {
      plain += run.exposed_seconds[i];
      plain_iteration += run.step_seconds[i];
      ++s.plain_steps;
    }
  }
  const auto mean = [](double sum, std::size_t n) {
    return n > 0 ? sum / static_cast<double>(n) : std::nan("");
  };
  s.forward_backward_seconds = mean(fb, run.step_seconds.size() - first);
  s.exposed_seconds = mean(exposed, s.overlapped_steps);
  s.iteration_seconds = mean(iteration, s.overlapped_steps);
  s.plain_step_seconds = mean(plain, s.plain_steps);
  s.plain_iteration_seconds = mean(plain_iteration, s.plain_steps);
  s.exposed_fraction = s.exposed_seconds / s.plain_step_seconds;
  return s;
}

// `auto`: the first CUDA device when one is usable, else the emulated one (@p note says why);
// `cuda` / `cuda:N`: that device or a bad-input error saying why not; `emulated`.
std::unique_ptr<device> open_demo_device(const demo_options& o, std::string& note) {
  const std::string& spec = o.device;
  const bool wants_cuda = spec == "cuda" || spec.rfind("cuda:", 0) == 0;
  if (spec != "auto" && spec != "emulated" && !wants_cuda) {
    throw input_error("--device", "expected auto, emulated, cuda or cuda:N", spec);
  }
  if (spec == "auto" || wants_cuda) {
    try {
      return open_device(spec == "auto" ? std::string("cuda") : spec);
    } catch (const input_error&) {
      throw input_error("--device", "expected auto, emulated, cuda or cuda:N", spec);
    } catch (const device_error& e) {
      if (wants_cuda) {
        throw input_error("--device", std::string("no usable CUDA device (") + e.what() + ")",
                          spec);
      }
      note = std::string("no usable CUDA device (") + e.what() + "); using the emulated device";
    }
  }
  emulated_device_options eo;
  eo.link = o.emu_link.empty() ? link_model::from_environment()
                               : link_model::parse(o.emu_link, "--emu-link");
  eo.copy_threads = 1;
  const std::uint64_t layer_bytes = demo_layer_bytes(o);
  // Grads, and for --verify the resident weights and moments, plus activations and slack.
  eo.hbm_bytes = static_cast<std::uint64_t>(o.hbm_budget_mib * 1048576.0) +
                 (o.window + 2) * layer_bytes + 5 * o.layers * layer_bytes +
                 (o.layers + 4) * o.batch * o.width * sizeof(float) + (std::uint64_t{64} << 20);
  return emulated_device::create(eo);
}

placement_options demo_placement_options(const demo_options& o) {
  placement_options po;
  if (!o.placement.empty()) {
    po.spec = o.placement;
  }
  po.reserve_bytes = 0;
  return po;
}

run_result train(const demo_options& o, device& dev, const topology& topo, bool resident,
                 bool quiet) {
  trainer run(o, dev, topo, resident);
  return run.run(quiet);
}

}  // namespace tierflow::cli::demo
