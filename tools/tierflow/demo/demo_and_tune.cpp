// `tierflow demo`: trains a stack of dense layers whose parameters live in a host tier (cold
// parameters, as ZeRO-Infinity keeps them) and are streamed into HBM by the prefetch scheduler
// for the forward and the backward pass, with offload_adam's state in the optimizer_state tier.
//
// The task: regression onto a fixed random teacher network (two tanh layers) over a fixed set
// of inputs, so the loss really falls. Each iteration is one plan pass: forward layer 0 .. L-1,
// then backward L-1 .. 0, each step reading its layer's weights from a staging slot, the
// compute stream doing the math through demo_compute: on the emulated device host callbacks
// over its memory, on a CUDA device the kernels of demo_kernels.cu on its compute stream.
// Then the scheduler is flushed (the host copies are about to change) and offload_adam steps:
// the grads come down, the update runs in the tier, the new weights land in the host copies.
//
// --verify runs the same training a second time with every weight resident in HBM and an
// Adam written out here over HBM-resident state (no offload at all), and compares the final
// weights bit for bit.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "commands.hpp"
#include "common/format.hpp"
#include "common/svg_chart.hpp"
#include "demo/demo_kernels.hpp"
#include "tierflow/device.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/schedule_model.hpp"
#include "tierflow/topology.hpp"
#include "tune/tune_plan.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

struct demo_options {
  std::size_t layers = 8;
  std::size_t width = 512;
  std::size_t batch = 32;
  std::size_t samples = 256;  // the fixed data set
  std::size_t steps = 300;
  std::uint64_t window = 2;
  double hbm_budget_mib = 0;  // 0: room for window + 2 layers
  std::string adam_mode = "auto";
  std::string placement;
  std::string emu_link;
  std::string device = "auto";
  double lr = 1e-3;
  std::size_t adam_chunk = std::size_t{1} << 18;  // elements
  std::uint64_t seed = 1;
  std::size_t log_every = 25;
  std::string out = "tierflow-demo";
  bool verify = false;
  bool as_json = false;
};

// ---- the model's math (fp32, fixed order: the same bits wherever the weights came from) ----

// z[i][o] = Σ_k h[i][k] w[o][k]: 16 partial sums per dot product, combined in a fixed order.
void forward_matmul(const float* h, const float* w, float* z, std::size_t batch,
                    std::size_t width) {
  for (std::size_t i = 0; i < batch; ++i) {
    const float* hi = h + i * width;
    for (std::size_t o = 0; o < width; ++o) {
      const float* wo = w + o * width;
      float acc[16] = {};
      std::size_t k = 0;
      for (; k + 16 <= width; k += 16) {
        for (std::size_t j = 0; j < 16; ++j) {
          acc[j] += hi[k + j] * wo[k + j];
        }
      }
      for (; k < width; ++k) {
        acc[k % 16] += hi[k] * wo[k];
      }
      for (std::size_t step = 8; step > 0; step /= 2) {
        for (std::size_t j = 0; j < step; ++j) {
          acc[j] += acc[j + step];
        }
      }
      z[i * width + o] = acc[0];
    }
  }
}

// dW[o][k] = Σ_i dz[i][o] h[i][k]; dh[i][k] = Σ_o dz[i][o] w[o][k] (when dh is not null).
void backward_matmul(const float* dz, const float* h, const float* w, float* dw, float* dh,
                     std::size_t batch, std::size_t width) {
  std::fill(dw, dw + width * width, 0.0f);
  for (std::size_t i = 0; i < batch; ++i) {
    for (std::size_t o = 0; o < width; ++o) {
      const float g = dz[i * width + o];
      float* row = dw + o * width;
      const float* hi = h + i * width;
      for (std::size_t k = 0; k < width; ++k) {
        row[k] += g * hi[k];
      }
    }
  }
  if (dh == nullptr) {
    return;
  }
  std::fill(dh, dh + batch * width, 0.0f);
  for (std::size_t i = 0; i < batch; ++i) {
    float* out = dh + i * width;
    for (std::size_t o = 0; o < width; ++o) {
      const float g = dz[i * width + o];
      const float* wo = w + o * width;
      for (std::size_t k = 0; k < width; ++k) {
        out[k] += g * wo[k];
      }
    }
  }
}

// Device buffers of one run: activations, the batch, grads, and scratch.
struct device_buffers {
  device& dev;
  std::vector<std::pair<void*, std::size_t>> owned;
  explicit device_buffers(device& d) : dev(d) {}
  device_buffers(const device_buffers&) = delete;
  device_buffers& operator=(const device_buffers&) = delete;
  ~device_buffers() {
    for (auto [p, n] : owned) {
      dev.memory().deallocate(p, n);
    }
  }
  float* floats(std::size_t n) {
    void* p = dev.memory().allocate(n * sizeof(float));
    owned.emplace_back(p, n * sizeof(float));
    return static_cast<float*>(p);
  }
};

struct data_set {
  std::vector<float> x;  // samples × width
  std::vector<float> t;  // samples × width
};

data_set make_data(const demo_options& o, std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t w = o.width;
  std::vector<float> t1(w * w), t2(w * w);
  const float scale = 1.5f / std::sqrt(static_cast<float>(w));
  for (auto& v : t1) {
    v = normal(gen) * scale;
  }
  for (auto& v : t2) {
    v = normal(gen) * scale;
  }
  data_set d;
  d.x.resize(o.samples * w);
  d.t.resize(o.samples * w);
  for (auto& v : d.x) {
    v = normal(gen);
  }
  std::vector<float> hidden(o.samples * w);
  forward_matmul(d.x.data(), t1.data(), hidden.data(), o.samples, w);
  for (auto& v : hidden) {
    v = std::tanh(v);
  }
  forward_matmul(hidden.data(), t2.data(), d.t.data(), o.samples, w);
  return d;
}

std::vector<std::vector<float>> init_weights(const demo_options& o, std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(o.width)));
  std::vector<std::vector<float>> w(o.layers, std::vector<float>(o.width * o.width));
  for (auto& layer : w) {
    for (auto& v : layer) {
      v = normal(gen);
    }
  }
  return w;
}

// The Adam update as offload_adam.hpp states it, written out here for the resident run.
struct resident_adam {
  adam_hyper hyper;
  std::uint64_t steps = 0;
  std::vector<float*> m, v;  // HBM-resident moments, one per layer
  // The next step's scalars (and the step count moves on).
  demo_cuda::adam_scalars next_step() {
    ++steps;
    const double t = static_cast<double>(steps);
    demo_cuda::adam_scalars s;
    s.decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
    s.beta1 = static_cast<float>(hyper.beta1);
    s.one_minus_beta1 = static_cast<float>(1.0 - hyper.beta1);
    s.beta2 = static_cast<float>(hyper.beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - hyper.beta2);
    s.neg_step = static_cast<float>(-(hyper.lr / (1.0 - std::pow(hyper.beta1, t))));
    s.bias_correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(hyper.beta2, t)));
    s.eps = static_cast<float>(hyper.eps);
    return s;
  }
  // One tensor's update on the host (demo_kernels.cu's adam_kernel does the same operations).
  static void update(const demo_cuda::adam_scalars& s, float* p, const float* g, float* m, float* v,
                     std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i] * 1.0f;
      float pi = p[i] * s.decay;
      m[i] = m[i] * s.beta1 + s.one_minus_beta1 * gi;
      v[i] = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
      pi = pi + s.neg_step * m[i] / (std::sqrt(v[i]) / s.bias_correction2 + s.eps);
      p[i] = pi;
    }
  }
};

// ---- where the math runs -------------------------------------------------------------------

// The demo's math for one model shape, enqueued on a stream of the device that holds the
// buffers (all pointers are device pointers): each call runs after the stream's earlier work.
class demo_compute {
 public:
  virtual ~demo_compute() = default;
  /** z = h wᵀ over the batch, then tanh in place when @p apply_tanh. */
  virtual void forward(stream& on, const float* h, const float* w, float* z, bool apply_tanh) = 0;
  /** dy = 2 (y - t) / count; the mean squared error lands in the host double @p loss_out once
   *  @p on has run this far. */
  virtual void loss(stream& on, const float* y, const float* target, float* dy,
                    double* loss_out) = 0;
  /** Through the tanh (dz ⊙= 1 - h_out², when @p h_out is not null), then dw = dzᵀ h_in and,
   *  when @p dh is not null, dh = dz w. */
  virtual void backward(stream& on, float* dz, const float* h_out, const float* h_in,
                        const float* w, float* dw, float* dh) = 0;
  /** One step of the resident Adam over every layer. */
  virtual void adam_step(stream& on, resident_adam& adam, const std::vector<float*>& params,
                         const std::vector<float*>& grads, std::size_t n) = 0;
  /** p[0 .. n) = 0. */
  virtual void zero(stream& on, float* p, std::size_t n) = 0;
};

// The emulated device: the host code above as host callbacks over its (host) memory.
class host_compute final : public demo_compute {
 public:
  host_compute(std::size_t batch, std::size_t width) : batch_(batch), width_(width) {}
  void forward(stream& on, const float* h, const float* w, float* z, bool apply_tanh) override {
    on.host_callback([batch = batch_, width = width_, h, w, z, apply_tanh] {
      forward_matmul(h, w, z, batch, width);
      if (apply_tanh) {
        for (std::size_t i = 0; i < batch * width; ++i) {
          z[i] = std::tanh(z[i]);
        }
      }
    });
  }
  void loss(stream& on, const float* y, const float* target, float* dy, double* loss_out) override {
    on.host_callback([count = batch_ * width_, y, target, dy, loss_out] {
      // The mean squared error over the batch's outputs, and its gradient.
      double loss = 0;
      const float scale = 2.0f / static_cast<float>(count);
      for (std::size_t i = 0; i < count; ++i) {
        const float d = y[i] - target[i];
        loss += static_cast<double>(d) * d;
        dy[i] = scale * d;
      }
      *loss_out = loss / static_cast<double>(count);
    });
  }
  void backward(stream& on, float* dz, const float* h_out, const float* h_in, const float* w,
                float* dw, float* dh) override {
    on.host_callback([batch = batch_, width = width_, dz, h_out, h_in, w, dw, dh] {
      if (h_out != nullptr) {  // through the tanh: dz = dh ⊙ (1 - h²)
        for (std::size_t i = 0; i < batch * width; ++i) {
          const float h = h_out[i];
          dz[i] = dz[i] * (1.0f - h * h);
        }
      }
      backward_matmul(dz, h_in, w, dw, dh, batch, width);
    });
  }
  void adam_step(stream& on, resident_adam& adam, const std::vector<float*>& params,
                 const std::vector<float*>& grads, std::size_t n) override {
    on.host_callback([&adam, params, grads, n] {
      const auto s = adam.next_step();
      for (std::size_t l = 0; l < params.size(); ++l) {
        resident_adam::update(s, params[l], grads[l], adam.m[l], adam.v[l], n);
      }
    });
  }
  void zero(stream& on, float* p, std::size_t n) override {
    on.host_callback([p, n] { std::fill(p, p + n, 0.0f); });
  }

 private:
  std::size_t batch_;
  std::size_t width_;
};

// A CUDA device: demo_kernels.cu on the stream's cudaStream_t (stream::native_handle()).
class cuda_compute final : public demo_compute {
 public:
  cuda_compute(device& dev, std::size_t batch, std::size_t width)
      : dev_(dev), batch_(batch), width_(width) {
    check(demo_cuda::device_index(dev.properties().pci_bus_id.c_str(), &index_),
          "cudaDeviceGetByPCIBusId");
    loss_ = static_cast<double*>(dev_.memory().allocate(sizeof(double)));
    // A copy into pageable memory would block this thread until the forward pass is done.
    loss_host_ = static_cast<double*>(std::aligned_alloc(page_bytes, page_bytes));
    if (loss_host_ == nullptr) {
      dev_.memory().deallocate(loss_, sizeof(double));
      throw std::bad_alloc();
    }
    try {
      dev_.host_registration().lock(loss_host_, page_bytes);
    } catch (...) {
      std::free(loss_host_);
      dev_.memory().deallocate(loss_, sizeof(double));
      throw;
    }
  }
  ~cuda_compute() override {
    dev_.host_registration().unlock(loss_host_, page_bytes);
    std::free(loss_host_);
    dev_.memory().deallocate(loss_, sizeof(double));
  }
  cuda_compute(const cuda_compute&) = delete;
  cuda_compute& operator=(const cuda_compute&) = delete;

  void forward(stream& on, const float* h, const float* w, float* z, bool apply_tanh) override {
    check(demo_cuda::forward(handle(on), h, w, z, batch_, width_, apply_tanh), "forward");
  }
  void loss(stream& on, const float* y, const float* target, float* dy, double* loss_out) override {
    check(demo_cuda::loss(handle(on), y, target, dy, batch_ * width_,
                          2.0f / static_cast<float>(batch_ * width_), loss_),
          "loss");
    dev_.copy_async(loss_host_, loss_, sizeof(double), copy_kind::d2h, on);
    on.host_callback([loss_out, from = loss_host_] { *loss_out = *from; });
  }
  void backward(stream& on, float* dz, const float* h_out, const float* h_in, const float* w,
                float* dw, float* dh) override {
    check(demo_cuda::backward(handle(on), dz, h_out, h_in, w, dw, dh, batch_, width_), "backward");
  }
  void adam_step(stream& on, resident_adam& adam, const std::vector<float*>& params,
                 const std::vector<float*>& grads, std::size_t n) override {
    const auto s = adam.next_step();
    for (std::size_t l = 0; l < params.size(); ++l) {
      check(demo_cuda::adam(handle(on), params[l], grads[l], adam.m[l], adam.v[l], n, s), "adam");
    }
  }
  void zero(stream& on, float* p, std::size_t n) override {
    check(demo_cuda::zero(handle(on), p, n), "zero");
  }

 private:
  void* handle(stream& on) {
    void* h = on.native_handle();
    if (h == nullptr) {
      throw device_error("demo: the CUDA kernels need a stream of a CUDA device, not '" +
                         std::string(on.name()) + "'");
    }
    check(demo_cuda::set_device(index_), "cudaSetDevice");
    return h;
  }
  static void check(int code, const char* what) {
    if (code != 0) {
      throw device_error(std::string("demo: ") + what +
                         " kernel launch failed: " + demo_cuda::error_string(code));
    }
  }

  device& dev_;
  std::size_t batch_;
  std::size_t width_;
  static constexpr std::size_t page_bytes = 4096;
  int index_ = 0;
  double* loss_ = nullptr;       // device
  double* loss_host_ = nullptr;  // page-locked
};

std::unique_ptr<demo_compute> make_compute(device& dev, std::size_t batch, std::size_t width) {
  if (dev.properties().backend == "cuda") {
    return std::make_unique<cuda_compute>(dev, batch, width);
  }
  return std::make_unique<host_compute>(batch, width);
}

struct run_result {
  std::vector<std::vector<float>> final_weights;
  std::vector<double> losses;
  std::vector<double> step_seconds;  // wall time of each training step
  std::size_t steps = 0;
  scheduler_metrics sched;
  std::string sched_json;
  std::string trace;
  std::string prometheus;
  std::optional<adam_metrics> adam;
  json state_pages;  // {class: {"total": pages, "nodes": {node: pages}}}
  placement_snapshot placement;
  double seconds = 0;
};

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
  const std::uint64_t layer_bytes = o.width * o.width * sizeof(float);
  // Grads, and for --verify the resident weights and moments, plus activations and slack.
  eo.hbm_bytes = static_cast<std::uint64_t>(o.hbm_budget_mib * 1048576.0) +
                 (o.window + 2) * layer_bytes + 5 * o.layers * layer_bytes +
                 (o.layers + 4) * o.batch * o.width * sizeof(float) + (std::uint64_t{64} << 20);
  return emulated_device::create(eo);
}

// One training run. resident: every weight in HBM and the resident Adam; otherwise the
// offloaded path.
run_result train(const demo_options& o, device& dev, const topology& topo, bool resident,
                 bool quiet) {
  std::mt19937_64 gen(o.seed);
  const data_set data = make_data(o, gen);
  const auto init = init_weights(o, gen);
  const std::size_t w = o.width;
  const std::size_t n = w * w;
  const std::size_t layer_bytes = n * sizeof(float);

  placement_options po;
  if (!o.placement.empty()) {
    po.spec = o.placement;
  }
  po.reserve_bytes = 0;
  placement_policy placement(topo, po);

  // The weights' host-tier copies (cold parameters) and the plan over them.
  std::vector<tier_allocation> host_weights;
  schedule_plan plan;
  for (std::size_t l = 0; l < o.layers; ++l) {
    host_weights.push_back(placement.allocate(data_class::params, layer_bytes));
    std::memcpy(host_weights.back().data(), init[l].data(), layer_bytes);
    plan.add_buffer({"layer" + std::to_string(l) + ".w", host_weights.back().data(), layer_bytes,
                     resident, false});
  }
  for (std::size_t l = 0; l < o.layers; ++l) {
    plan.add_step({"fwd" + std::to_string(l), {static_cast<buffer_id>(l)}, {}});
  }
  for (std::size_t l = o.layers; l-- > 0;) {
    plan.add_step({"bwd" + std::to_string(l), {static_cast<buffer_id>(l)}, {}});
  }
  scheduler_options so;
  so.window = o.window;
  so.trace = !resident;
  const std::uint64_t slack = 256 * (o.layers + 4);
  so.hbm_budget_bytes =
      resident ? o.layers * layer_bytes + slack
               : (o.hbm_budget_mib > 0 ? static_cast<std::uint64_t>(o.hbm_budget_mib * 1048576.0)
                                       : (o.window + 2) * layer_bytes + slack);
  prefetch_scheduler sched(dev, std::move(plan), so);

  device_buffers buf(dev);
  std::vector<float*> acts;  // h_0 .. h_{L-1}, and y
  for (std::size_t l = 0; l <= o.layers; ++l) {
    acts.push_back(buf.floats(o.batch * w));
  }
  float* target = buf.floats(o.batch * w);
  float* dh_a = buf.floats(o.batch * w);
  float* dh_b = buf.floats(o.batch * w);
  std::vector<float*> grads;
  for (std::size_t l = 0; l < o.layers; ++l) {
    grads.push_back(buf.floats(n));
  }
  std::vector<float> pinned_x(o.batch * w), pinned_t(o.batch * w);  // the batch, host side
  const auto math = make_compute(dev, o.batch, w);

  adam_hyper hyper;
  hyper.lr = o.lr;
  hyper.weight_decay = 0.01;
  std::unique_ptr<offload_adam> adam;
  resident_adam reference;
  if (resident) {
    reference.hyper = hyper;
    for (std::size_t l = 0; l < o.layers; ++l) {
      reference.m.push_back(buf.floats(n));
      reference.v.push_back(buf.floats(n));
      math->zero(dev.compute_stream(), reference.m.back(), n);
      math->zero(dev.compute_stream(), reference.v.back(), n);
    }
  } else {
    adam_group group;
    group.hyper = hyper;
    for (std::size_t l = 0; l < o.layers; ++l) {
      adam_param p;
      p.name = "layer" + std::to_string(l) + ".w";
      p.param = host_weights[l].data();
      p.grad = grads[l];
      p.elements = n;
      p.param_on_host = true;
      group.params.push_back(p);
    }
    adam_options ao;
    const auto mode = parse_adam_mode(o.adam_mode);
    if (!mode) {
      throw input_error("--adam-mode", "expected cpu, streamed or auto", o.adam_mode);
    }
    ao.mode = *mode;
    ao.chunk_elements = std::min<std::size_t>(n, o.adam_chunk);
    adam = std::make_unique<offload_adam>(dev, std::vector<adam_group>{group}, ao, placement);
  }

  run_result result;
  const auto start = clock_type::now();
  auto batch_start = clock_type::now();
  const std::size_t batches = o.samples / o.batch;
  std::vector<double> loss_slot(1, 0.0);
  stream& compute = dev.compute_stream();
  for (std::size_t step = 0; step < o.steps; ++step) {
    const auto step_start = clock_type::now();
    const std::size_t b = step % batches;
    std::memcpy(pinned_x.data(), data.x.data() + b * o.batch * w, o.batch * w * sizeof(float));
    std::memcpy(pinned_t.data(), data.t.data() + b * o.batch * w, o.batch * w * sizeof(float));
    dev.copy_async(acts[0], pinned_x.data(), o.batch * w * sizeof(float), copy_kind::h2d, compute);
    dev.copy_async(target, pinned_t.data(), o.batch * w * sizeof(float), copy_kind::h2d, compute);
    for (std::size_t l = 0; l < o.layers; ++l) {
      const staged_step& st = sched.acquire(l);
      const auto* wl = static_cast<const float*>(st.pointer(static_cast<buffer_id>(l)));
      const bool last = l + 1 == o.layers;
      math->forward(st.compute(), acts[l], wl, acts[l + 1], !last);
      if (last) {
        math->loss(st.compute(), acts[l + 1], target, dh_a, loss_slot.data());
      }
      sched.release(l, false);
    }
    for (std::size_t k = 0; k < o.layers; ++k) {
      const std::size_t l = o.layers - 1 - k;
      const staged_step& st = sched.acquire(o.layers + k);
      const auto* wl = static_cast<const float*>(st.pointer(static_cast<buffer_id>(l)));
      float* dz = k % 2 == 0 ? dh_a : dh_b;
      float* dh_next = k % 2 == 0 ? dh_b : dh_a;
      math->backward(st.compute(), dz, l + 1 != o.layers ? acts[l + 1] : nullptr, acts[l], wl,
                     grads[l], l == 0 ? nullptr : dh_next);
      sched.release(o.layers + k, false);
    }
    if (resident) {
      std::vector<float*> params;
      for (std::size_t l = 0; l < o.layers; ++l) {
        params.push_back(static_cast<float*>(sched.resident_pointer(static_cast<buffer_id>(l))));
      }
      math->adam_step(compute, reference, params, grads, n);
      compute.synchronize();
    } else {
      sched.flush();  // the host copies change next: nothing may stay staged
      const auto r = adam->step();
      if (!r.applied) {
        throw error("demo: the optimizer skipped a step: " + r.skip_reason);
      }
    }
    compute.synchronize();
    result.losses.push_back(loss_slot[0]);
    result.step_seconds.push_back(
        std::chrono::duration<double>(clock_type::now() - step_start).count());
    ++result.steps;
    if (!quiet && o.log_every > 0 && (step + 1) % o.log_every == 0) {
      const auto m = sched.metrics();
      const double dt = std::chrono::duration<double>(clock_type::now() - batch_start).count() /
                        static_cast<double>(o.log_every);
      batch_start = clock_type::now();
      const double adam_ms = adam ? 1e3 * adam->metrics().last_step_seconds : 0.0;
      std::fprintf(stderr,
                   "step %5zu  loss %.6f  step %.1f ms  stall %.1f %%  h2d %.2f GB/s  adam %.1f "
                   "ms\n",
                   step + 1, loss_slot[0], dt * 1e3, 100.0 * m.stall_fraction,
                   m.h2d.achieved_gbps(), adam_ms);
    }
  }
  result.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  sched.flush();
  for (std::size_t l = 0; l < o.layers; ++l) {
    if (resident) {  // device memory: copied down
      result.final_weights.emplace_back(n);
      dev.copy_async(result.final_weights.back().data(),
                     sched.resident_pointer(static_cast<buffer_id>(l)), layer_bytes, copy_kind::d2h,
                     compute);
    } else {
      const auto* src = static_cast<const float*>(host_weights[l].data());
      result.final_weights.emplace_back(src, src + n);
    }
  }
  compute.synchronize();
  result.sched = sched.metrics();
  result.sched_json = sched.snapshot_json();
  result.prometheus = sched.prometheus_text();
  result.trace = sched.trace_json();
  if (adam) {
    result.adam = adam->metrics();
    for (data_class cls : {data_class::master_params, data_class::optimizer_state}) {
      const page_residency r = adam->state_residency(cls);
      json nodes = json::object();
      for (const auto& [node, pages] : r.pages_on_node) {
        nodes[std::to_string(node)] = pages;
      }
      result.state_pages[std::string(to_string(cls))] = {{"total", r.total_pages},
                                                         {"nodes", nodes}};
    }
  }
  result.placement = placement.snapshot();
  return result;
}

// The inputs of predict_schedule besides the plan: the device's links, fitted by a probe.
struct link_fits {
  link_fit h2d;
  link_fit d2h;
  bool full_duplex = true;
  /** What a step costs beside its compute and copies (callbacks, event handoffs between the
   * device's threads): from probe_step_overhead(), added to every step's compute time. */
  double step_overhead_s = 0;
};

// Copies of two sizes in batches on the device in use; per size the median over batches of
// (batch time / copies); latency and bandwidth from the line through the two points.
link_fits probe_links(device& dev) {
  constexpr std::size_t small = std::size_t{64} << 10;
  constexpr std::size_t large = std::size_t{8} << 20;
  constexpr int batches = 5;
  constexpr int per_batch = 8;
  std::vector<std::byte> host(large);
  std::mt19937_64 gen(std::random_device{}());
  for (auto& b : host) {
    b = static_cast<std::byte>(gen());
  }
  device_buffers buf(dev);
  void* device_copy = buf.floats(large / sizeof(float));
  const auto seconds_per_copy = [&](copy_kind kind, std::size_t bytes) {
    stream& s = kind == copy_kind::h2d ? dev.h2d_stream() : dev.d2h_stream();
    std::vector<double> samples;
    for (int b = 0; b < batches; ++b) {
      const auto start = clock_type::now();
      for (int i = 0; i < per_batch; ++i) {
        if (kind == copy_kind::h2d) {
          dev.copy_async(device_copy, host.data(), bytes, kind, s);
        } else {
          dev.copy_async(host.data(), device_copy, bytes, kind, s);
        }
      }
      s.synchronize();
      samples.push_back(std::chrono::duration<double>(clock_type::now() - start).count() /
                        per_batch);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
  };
  const auto fit = [&](copy_kind kind) {
    (void)seconds_per_copy(kind, small);  // warm up
    const double t_small = seconds_per_copy(kind, small);
    const double t_large = seconds_per_copy(kind, large);
    link_fit f;
    if (t_large > t_small) {
      f.gbps = static_cast<double>(large - small) / (t_large - t_small) / 1e9;
      f.latency_s = std::max(0.0, t_small - static_cast<double>(small) / (f.gbps * 1e9));
    } else {  // noise swamped the difference: all of it bandwidth
      f.gbps = static_cast<double>(large) / t_large / 1e9;
    }
    return f;
  };
  link_fits out;
  out.h2d = fit(copy_kind::h2d);
  out.d2h = fit(copy_kind::d2h);
  out.full_duplex = dev.properties().full_duplex;
  return out;
}

int run_demo(const demo_options& o) {
  if (o.layers == 0 || o.width == 0 || o.batch == 0 || o.steps == 0) {
    throw input_error("tierflow demo", "--layers, --width, --batch and --steps must be > 0");
  }
  if (o.samples < o.batch) {
    throw input_error("--samples", "must be at least --batch", std::to_string(o.samples));
  }
  if (!parse_adam_mode(o.adam_mode)) {
    throw input_error("--adam-mode", "expected cpu, streamed or auto", o.adam_mode);
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    throw input_error("--lr", "must be finite and > 0", std::to_string(o.lr));
  }
  if (o.adam_chunk == 0) {
    throw input_error("--adam-chunk", "must be > 0 (elements per chunk)", "0");
  }
  if (!std::isfinite(o.hbm_budget_mib) || o.hbm_budget_mib < 0) {
    throw input_error("--hbm-budget", "must be finite and >= 0 (0: window + 2 layers)",
                      std::to_string(o.hbm_budget_mib));
  }
  if (const double layer_mib = static_cast<double>(o.width * o.width * sizeof(float)) / 1048576.0;
      o.hbm_budget_mib > 0 && o.hbm_budget_mib < layer_mib) {
    throw input_error("--hbm-budget",
                      "below one layer's weights (" + std::to_string(layer_mib) + " MiB)",
                      std::to_string(o.hbm_budget_mib));
  }
  // Bad input is reported before anything runs: the output folder, then the placement.
  std::error_code made;
  std::filesystem::create_directories(o.out, made);
  if (made || !std::filesystem::is_directory(o.out)) {
    throw input_error("--out",
                      "cannot create the folder" + (made ? ": " + made.message() : std::string()),
                      o.out);
  }
  const topology topo = topology::discover();
  if (!o.placement.empty()) {
    (void)placement_spec::parse(o.placement, "--placement", topo);
  }
  std::string note;
  auto dev = open_demo_device(o, note);
  if (!note.empty() && !o.as_json) {
    std::fprintf(stderr, "tierflow demo: %s\n", note.c_str());
  }
  if (!o.as_json) {
    std::fprintf(stderr,
                 "tierflow demo: %zu layers x %zu (%.1f MiB of weights), batch %zu, %zu steps, "
                 "window %llu, device %s\n",
                 o.layers, o.width,
                 static_cast<double>(o.layers * o.width * o.width * 4) / 1048576.0, o.batch,
                 o.steps, static_cast<unsigned long long>(o.window),
                 dev->properties().name.c_str());
  }
  const run_result run = train(o, *dev, topo, false, o.as_json);
  // What the link does on this device with nothing else running, for "achieved vs
  // benchmarked": the same probe as tune --with-model (copies of 64 KiB and 8 MiB).
  const link_fits probed = probe_links(*dev);

  const auto dir = std::filesystem::path(o.out);
  json metrics = json::parse(run.sched_json);
  metrics["adam"] = json::parse(run.adam->to_json())["adam"];
  metrics["placement"] = json::parse(to_json(run.placement))["placement"];
  write_text_file(dir / "metrics.json", metrics.dump(2) + "\n");
  write_text_file(dir / "trace.json", run.trace);
  write_text_file(dir / "metrics.prom", run.prometheus);

  json verify;
  if (o.verify) {
    const run_result ref = train(o, *dev, topo, true, true);
    bool same = ref.final_weights.size() == run.final_weights.size();
    double max_diff = 0;
    for (std::size_t l = 0; same && l < run.final_weights.size(); ++l) {
      const auto& a = ref.final_weights[l];
      const auto& b = run.final_weights[l];
      same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
      for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      }
    }
    verify = {{"bit_identical", same}, {"max_abs_diff", max_diff}};
  }

  const auto& s = run.sched;
  json tiers = json::object();
  for (const auto& [cls, per_tier] : run.placement.class_bytes) {
    for (const auto& [tier, bytes] : per_tier) {
      tiers[tier][std::string(to_string(cls))] = bytes;
    }
  }
  json doc{{"loss_first", run.losses.front()},
           {"loss_last", run.losses.back()},
           {"steps", run.steps},
           {"backend", dev->properties().backend},
           {"adam_mode", to_string(run.adam->mode)},
           {"adam_mode_reason", run.adam->mode_reason},
           {"scheduler",
            {{"step_time_s", s.step_time_s},
             {"lower_bound_s", s.lower_bound_s},
             {"overlap_efficiency", s.overlap_efficiency},
             {"stall_fraction", s.stall_fraction},
             {"window", s.window},
             {"bytes_in", s.bytes_in},
             {"hbm_staging_peak_bytes", s.hbm_staging_peak_bytes},
             {"h2d_achieved_gbps", s.h2d.achieved_gbps()},
             {"h2d_link_gbps", s.h2d_gbps}}},
           {"link",
            {{"h2d_achieved_gbps", s.h2d.achieved_gbps()},
             {"h2d_benchmarked_gbps", probed.h2d.gbps},
             {"d2h_benchmarked_gbps", probed.d2h.gbps},
             {"h2d_latency_us", probed.h2d.latency_s * 1e6}}},
           {"tiers", tiers},
           {"state_pages", run.state_pages},
           {"seconds", run.seconds},
           {"files",
            {{"metrics", (dir / "metrics.json").string()},
             {"trace", (dir / "trace.json").string()},
             {"prometheus", (dir / "metrics.prom").string()}}}};
  if (o.verify) {
    doc["verify"] = verify;
  }
  if (o.as_json) {
    std::printf("%s\n", doc.dump().c_str());
  } else {
    std::printf("\ntierflow demo: %zu steps in %.1f s; loss %.6f -> %.6f (%.1fx lower)\n",
                run.steps, run.seconds, run.losses.front(), run.losses.back(),
                run.losses.front() / run.losses.back());
    std::printf("where the bytes lived:\n");
    for (const auto& [cls, per_tier] : run.placement.class_bytes) {
      for (const auto& [tier, bytes] : per_tier) {
        std::printf("  %-16s %-10s %10.1f MiB\n", std::string(to_string(cls)).c_str(), tier.c_str(),
                    static_cast<double>(bytes) / 1048576.0);
      }
    }
    std::printf("  %-16s %-10s %10.1f MiB peak (budget %.1f MiB)\n", "staging", "hbm",
                static_cast<double>(s.hbm_staging_peak_bytes) / 1048576.0,
                static_cast<double>(s.hbm_budget_bytes) / 1048576.0);
    std::printf(
        "prefetch: window %llu, step %.2f ms vs lower bound %.2f ms (overlap efficiency "
        "%.2f), stall %.1f %%\n",
        static_cast<unsigned long long>(s.window), s.step_time_s * 1e3, s.lower_bound_s * 1e3,
        s.overlap_efficiency, 100.0 * s.stall_fraction);
    // Achieved: the weights' bytes over the whole run's time (compute included); benchmarked:
    // the probe's 8 MiB copies on this device, alone.
    std::printf(
        "link: h2d achieved %.2f GB/s; benchmarked %.2f GB/s h2d, %.2f GB/s d2h (8 MiB "
        "copies on this device, alone)",
        s.h2d.achieved_gbps(), probed.h2d.gbps, probed.d2h.gbps);
    if (dev->properties().backend == "emulated") {
      std::printf("; the emulated link's cap %.2f GB/s\n", s.h2d_gbps);
    } else {
      std::printf("\n");
    }
    std::printf("adam: mode %s (%s), kernel %s, %.1f ms per step\n",
                std::string(to_string(run.adam->mode)).c_str(), run.adam->mode_reason.c_str(),
                std::string(to_string(run.adam->kernel)).c_str(),
                1e3 * run.adam->step_seconds_total / static_cast<double>(run.steps));
    if (o.verify) {
      std::printf(
          "verify: against the same run with everything resident in HBM and no "
          "offload: %s (max abs diff %g)\n",
          verify["bit_identical"].get<bool>() ? "bit-identical" : "DIFFERENT",
          verify["max_abs_diff"].get<double>());
    }
    std::printf("files: %s, %s, %s\n", (dir / "metrics.json").c_str(), (dir / "trace.json").c_str(),
                (dir / "metrics.prom").c_str());
  }
  if (o.verify && !verify["bit_identical"].get<bool>()) {
    return exit_failure;
  }
  return exit_ok;
}

// ---- tierflow tune: sweep the prefetch window × the Adam chunk × the Adam mode ------------
//
// Two workloads: the demo's model (train() above, unchanged) or a plan file (tune_plan.hpp:
// buffers and steps, each step's compute a timed host callback). Both give a list of
// tune_points, measured, predicted by predict_schedule(), or both; one report (table, JSON,
// HTML, Pareto front, recommendation) serves them all.

struct tune_options {
  demo_options model;
  std::size_t measure_steps = 20;
  std::size_t warmup_steps = 5;
  std::string windows = "0,1,2,3,4";
  std::string chunks = "65536,262144,1048576";
  std::string adam_modes = "cpu,streamed";
  double hbm_budget_mib = 0;  // 0: no limit
  bool as_json = false;
  std::string html;
  std::string plan;  // a plan file instead of the demo's model
  bool model_only = false;
  bool with_model = false;
};

std::vector<std::uint64_t> parse_list(const std::string& text, const std::string& flag,
                                      bool allow_zero) {
  std::vector<std::uint64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    std::uint64_t value = 0;
    try {
      value = std::stoull(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || item[0] == '-' || (!allow_zero && value == 0)) {
      throw input_error(flag,
                        allow_zero ? "expected a comma-separated list of integers >= 0"
                                   : "expected a comma-separated list of integers > 0",
                        text);
    }
    out.push_back(value);
  }
  if (out.empty()) {
    throw input_error(flag, "the list is empty", text);
  }
  return out;
}

std::vector<std::string> parse_modes(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!parse_adam_mode(item)) {
      throw input_error("--adam-modes", "expected a comma-separated list of cpu, streamed, auto",
                        text);
    }
    out.push_back(item);
  }
  if (out.empty()) {
    throw input_error("--adam-modes", "the list is empty", text);
  }
  return out;
}

constexpr double not_predicted = -1.0;

struct tune_point {
  std::uint64_t window = 0;
  std::uint64_t chunk = 0;  // bytes; 0 for a plan (no Adam)
  std::string mode;         // the mode that ran (auto resolved); "none" for a plan
  double step_s = 0;        // measured, or predicted with --model-only
  double stall = 0;
  std::uint64_t hbm = 0;               // the staging peak (+ streamed Adam's)
  double predicted_s = not_predicted;  // --with-model: the model's step time
  bool pareto = false;
};

// Median step time of the measured steps (after the warmup ones).
double median_after(std::vector<double> seconds, std::size_t warmup) {
  seconds.erase(seconds.begin(), seconds.begin() + static_cast<long>(warmup));
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// ---- the demo's model as a workload ----

// The plan train() builds (forward 0 .. L-1, backward L-1 .. 0, one layer each), without data,
// and the budget it gives the scheduler.
schedule_plan demo_plan_shape(const demo_options& o) {
  const std::size_t layer_bytes = o.width * o.width * sizeof(float);
  schedule_plan plan;
  for (std::size_t l = 0; l < o.layers; ++l) {
    plan.add_buffer({"layer" + std::to_string(l) + ".w", nullptr, layer_bytes, false, false});
  }
  for (std::size_t l = 0; l < o.layers; ++l) {
    plan.add_step({"fwd" + std::to_string(l), {static_cast<buffer_id>(l)}, {}});
  }
  for (std::size_t l = o.layers; l-- > 0;) {
    plan.add_step({"bwd" + std::to_string(l), {static_cast<buffer_id>(l)}, {}});
  }
  return plan;
}

std::uint64_t demo_staging_budget(const demo_options& o) {
  return (o.window + 2) * o.width * o.width * sizeof(float) + 256 * (o.layers + 4);
}

// What the model needs of one (Adam mode, chunk) of the demo, from a short run of it: each
// layer step's compute time (the scheduler's per-step accounting) and the Adam step's time.
struct demo_calibration {
  std::vector<double> compute_s;
  double adam_s = 0;
  std::uint64_t adam_hbm = 0;
  std::string mode;
};

constexpr std::size_t calibration_warmup = 1;
constexpr std::size_t calibration_steps = 8;

demo_calibration calibrate_demo(demo_options o, device& dev, const topology& topo) {
  // A run's first steps fault in its fresh buffers and are slower: time a run of only those
  // steps too, and keep the difference, the steady state.
  o.steps = calibration_warmup;
  const run_result cold = train(o, dev, topo, false, true);
  o.steps = calibration_warmup + calibration_steps;
  const run_result r = train(o, dev, topo, false, true);
  demo_calibration c;
  for (std::size_t i = 0; i < r.sched.per_step.size(); ++i) {
    const auto& all = r.sched.per_step[i];
    const auto& first = cold.sched.per_step[i];
    const double seconds = std::max(0.0, all.compute_seconds - first.compute_seconds);
    c.compute_s.push_back(
        all.runs > first.runs ? seconds / static_cast<double>(all.runs - first.runs) : 0.0);
  }
  // The last step's: the first ones also place and fault in the optimizer state.
  c.adam_s = r.adam->last_step_seconds;
  c.adam_hbm = r.adam->hbm_staging_peak_bytes + r.adam->hbm_undo_bytes;
  c.mode = std::string(to_string(r.adam->mode));
  return c;
}

// One demo iteration as the model sees it: the batch's two uploads on the compute stream, the
// plan pass ending in the flush, then the Adam step (the host waits for it).
void predict_demo(const demo_options& o, const demo_calibration& c, const link_fits& links,
                  tune_point& p, double& predicted) {
  schedule_model_options mo;
  mo.hbm_budget_bytes = demo_staging_budget(o);
  mo.window = o.window;
  mo.h2d = links.h2d;
  mo.d2h = links.d2h;
  mo.full_duplex = links.full_duplex;
  mo.flush_each_iteration = true;
  std::vector<double> compute = c.compute_s;
  for (auto& s : compute) {
    s += links.step_overhead_s;
  }
  const auto pred = predict_schedule(demo_plan_shape(o), compute, mo);
  predicted =
      2 * links.h2d.seconds(o.batch * o.width * sizeof(float)) + pred.iteration_s + c.adam_s;
  p.stall = pred.stall_s / predicted;
  p.hbm = pred.staging_peak_bytes + c.adam_hbm;
}

// ---- a plan file as a workload ----

std::uint64_t plan_staging_budget(const tune_plan& tp, std::uint64_t window) {
  std::uint64_t resident = 0;
  std::uint64_t staged_total = 0;
  for (const auto& b : tp.plan.buffers) {
    (b.resident ? resident : staged_total) += b.bytes;
  }
  std::uint64_t largest_step = 0;
  for (const auto& s : tp.plan.steps) {
    std::uint64_t bytes = 0;
    for (const auto* list : {&s.reads, &s.writes}) {
      for (buffer_id id : *list) {
        bytes += tp.plan.buffers[id].resident ? 0 : tp.plan.buffers[id].bytes;
      }
    }
    largest_step = std::max(largest_step, bytes);
  }
  // Room for the window plus the step running and the one being released, never more than
  // every staged buffer at once beside the largest step; alignment slack per buffer.
  const std::uint64_t staging = std::min((window + 2) * largest_step, staged_total + largest_step);
  return resident + staging + 2 * 256 * (tp.plan.buffers.size() + 4);
}

// Holds the plan's host buffers (the params tier, random bytes) for every window of the sweep.
struct plan_workload {
  tune_plan tp;
  placement_policy placement;
  std::vector<tier_allocation> host;
  plan_workload(tune_plan parsed, const topology& topo, const demo_options& o)
      : tp(std::move(parsed)), placement(topo, placement_options_of(o)) {
    std::mt19937_64 gen(std::random_device{}());
    for (auto& b : tp.plan.buffers) {
      host.push_back(placement.allocate(data_class::params, b.bytes));
      auto* words = static_cast<std::uint64_t*>(host.back().data());
      auto* bytes = static_cast<unsigned char*>(host.back().data());
      for (std::size_t i = 0; i < b.bytes / 8; ++i) {
        words[i] = gen();
      }
      for (std::size_t i = b.bytes / 8 * 8; i < b.bytes; ++i) {
        bytes[i] = static_cast<unsigned char>(gen());
      }
      b.data = host.back().data();
    }
  }
  static placement_options placement_options_of(const demo_options& o) {
    placement_options po;
    if (!o.placement.empty()) {
      po.spec = o.placement;
    }
    po.reserve_bytes = 0;
    return po;
  }
};

// Compute for @p seconds on the calling thread: sleep through most of it, spin the rest, so
// that the step takes what the plan says and no less.
void compute_for(double seconds) {
  const auto end = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                           std::chrono::duration<double>(seconds));
  constexpr auto spin = std::chrono::microseconds(300);
  if (const auto left = end - clock_type::now(); left > 2 * spin) {
    std::this_thread::sleep_for(left - spin);
  }
  while (clock_type::now() < end) {
  }
}

// Runs warmup + measured iterations of the plan at one window; an iteration's time is from the
// start of step 0's compute to the next (the scheduler's and the model's definition).
tune_point run_plan(plan_workload& w, device& dev, std::uint64_t window, std::size_t warmup,
                    std::size_t measured) {
  // Declared before the scheduler: its destructor waits for the callbacks that write it.
  std::vector<clock_type::time_point> starts;
  const std::size_t iterations = warmup + measured + 1;
  starts.reserve(iterations);
  scheduler_options so;
  so.window = window;
  so.hbm_budget_bytes = plan_staging_budget(w.tp, window);
  prefetch_scheduler sched(dev, w.tp.plan, so);
  const auto& steps = w.tp.plan.steps;
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const staged_step& st = sched.acquire(i);
      const double seconds = w.tp.compute_s[i];
      const bool first = i == 0;
      st.compute().host_callback([&starts, seconds, first] {
        if (first) {
          starts.push_back(clock_type::now());
        }
        compute_for(seconds);
      });
      sched.release(i, !steps[i].writes.empty());
    }
  }
  dev.compute_stream().synchronize();
  sched.flush();
  std::vector<double> iteration_s;
  for (std::size_t k = 1; k < starts.size(); ++k) {
    iteration_s.push_back(std::chrono::duration<double>(starts[k] - starts[k - 1]).count());
  }
  const auto m = sched.metrics();
  tune_point p;
  p.window = window;
  p.mode = "none";
  p.step_s = median_after(iteration_s, warmup);
  p.stall = m.stall_fraction;
  p.hbm = m.hbm_staging_peak_bytes;
  return p;
}

// A plan of 8 steps with no compute over 4 KiB buffers, through the scheduler at window 2:
// the median iteration / 8 is what a step costs on this device beside compute and copies.
double probe_step_overhead(device& dev, const topology& topo, const demo_options& o) {
  constexpr std::size_t steps = 8;
  tune_plan tp;
  for (std::size_t i = 0; i < steps; ++i) {
    tp.plan.add_buffer({"probe" + std::to_string(i), nullptr, 4096, false, false});
    tp.plan.add_step({"probe" + std::to_string(i), {static_cast<buffer_id>(i)}, {}});
    tp.compute_s.push_back(0.0);
    tp.total_bytes += 4096;
  }
  plan_workload w(std::move(tp), topo, o);
  const tune_point p = run_plan(w, dev, 2, 3, 15);
  return p.step_s / steps;
}

void predict_plan(const tune_plan& tp, const link_fits& links, tune_point& p, double& predicted) {
  schedule_model_options mo;
  mo.hbm_budget_bytes = plan_staging_budget(tp, p.window);
  mo.window = p.window;
  mo.h2d = links.h2d;
  mo.d2h = links.d2h;
  mo.full_duplex = links.full_duplex;
  std::vector<double> compute = tp.compute_s;
  for (auto& c : compute) {
    c += links.step_overhead_s;
  }
  const auto pred = predict_schedule(tp.plan, compute, mo);
  predicted = pred.iteration_s;
  p.stall = pred.stall_fraction;
  p.hbm = pred.staging_peak_bytes;
}

// ---- the report ----

// What was swept and how: filled by the workload, read by the report.
struct tune_sweep {
  std::vector<tune_point> points;
  json skipped = json::array();  // Adam modes this workload cannot run, with the reason
  json workload;
  std::string workload_text;  // for the page, HTML-escaped
  json model;                 // the link fits and calibration; null without a model
};

std::string point_label(const tune_point& p) {
  return p.mode == "none" ? std::string("plan")
                          : p.mode + ", chunk " + std::to_string(p.chunk / 1024) + " KiB";
}

// The page of `tune --html`: step time and stall against the window, one line per (Adam mode,
// chunk), then every point with the front and the recommendation marked.
std::string tune_html(const std::vector<tune_point>& sweep, const tune_point& pick,
                      const std::string& workload_text, bool predicted) {
  std::map<std::pair<std::string, std::uint64_t>, std::pair<chart_series, chart_series>> lines;
  for (const auto& p : sweep) {
    auto& [time, stall] = lines[{p.mode, p.chunk}];
    time.label = stall.label = point_label(p);
    time.points.emplace_back(static_cast<double>(p.window), p.step_s * 1e3);
    stall.points.emplace_back(static_cast<double>(p.window), 100 * p.stall);
  }
  std::vector<chart_series> times;
  std::vector<chart_series> stalls;
  for (auto& [key, pair] : lines) {
    times.push_back(std::move(pair.first));
    stalls.push_back(std::move(pair.second));
  }
  const bool with_model = !sweep.empty() && sweep.front().predicted_s != not_predicted;
  const auto window_tick = [](double w) { return std::to_string(std::lround(w)); };
  const std::string unit = sweep.front().mode == "none" ? "steps" : "layers";
  chart_axes time_axes{"prefetch window (" + unit + ")", "ms per step", false, window_tick,
                       "step time against the prefetch window"};
  chart_axes stall_axes{"prefetch window (" + unit + ")", "stall %", false, window_tick,
                        "stall against the prefetch window"};
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<title>tierflow tune</title>\n<style>\nbody{font:14px/1.4 system-ui,sans-serif;"
       "margin:24px;color:#222;max-width:1100px}\ntable{border-collapse:collapse}td,th{border:"
       "1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}\n"
       "svg text{font:12px system-ui,sans-serif}.pick{font-weight:700;background:#fff6d5}\n"
       "</style></head><body>\n<h1>tierflow tune</h1>\n<p>Workload: "
    << workload_text << (predicted ? " Every figure is predicted by the model, not measured." : "")
    << " Recommended: window " << pick.window;
  if (pick.mode != "none") {
    o << ", Adam chunk " << pick.chunk / 1024 << " KiB, mode " << html_escape(pick.mode);
  }
  o << " (" << short_number(pick.step_s * 1e3, 4) << " ms per step).</p>\n<h2>Step time</h2>\n"
    << svg_line_chart(std::move(times), time_axes) << "<h2>Stall</h2>\n"
    << svg_line_chart(std::move(stalls), stall_axes)
    << "<h2>Every setting</h2>\n<table><tr><th>window</th><th>Adam chunk</th><th>mode</th>"
       "<th>ms per step</th>"
    << (with_model ? "<th>predicted ms</th>" : "")
    << "<th>stall %</th><th>HBM staging MiB</th><th>Pareto</th></tr>\n";
  for (const auto& p : sweep) {
    const bool picked = &p == &pick;
    o << "<tr" << (picked ? " class=\"pick\"" : "") << "><td>" << p.window << "</td><td>"
      << p.chunk / 1024 << " KiB</td><td>" << html_escape(p.mode) << "</td><td>"
      << short_number(p.step_s * 1e3, 4) << "</td>";
    if (with_model) {
      o << "<td>" << short_number(p.predicted_s * 1e3, 4) << "</td>";
    }
    o << "<td>" << short_number(100 * p.stall, 3) << "</td><td>"
      << short_number(static_cast<double>(p.hbm) / 1048576.0, 4) << "</td><td>"
      << (p.pareto ? "*" : "") << "</td></tr>\n";
  }
  o << "</table>\n</body></html>\n";
  return o.str();
}

// Pareto front, recommendation, then the table, the JSON and the page.
int report_tune(const tune_options& t, tune_sweep& s) {
  auto& sweep = s.points;
  const std::uint64_t budget = static_cast<std::uint64_t>(t.hbm_budget_mib * 1048576.0);
  // Pareto front over (step time, HBM staging bytes): no other point is at least as good in
  // both and better in one.
  for (auto& p : sweep) {
    p.pareto = std::none_of(sweep.begin(), sweep.end(), [&](const tune_point& q) {
      return q.step_s <= p.step_s && q.hbm <= p.hbm && (q.step_s < p.step_s || q.hbm < p.hbm);
    });
  }
  // The recommendation: the fastest within the budget; within 2 % of it, the least HBM.
  const tune_point* best = nullptr;
  for (const auto& p : sweep) {
    if (budget != 0 && p.hbm > budget) {
      continue;
    }
    if (best == nullptr || p.step_s < best->step_s) {
      best = &p;
    }
  }
  if (sweep.empty()) {
    throw input_error("--adam-modes", "this workload runs none of them",
                      t.adam_modes + " (" + s.skipped.front()["reason"].get<std::string>() + ")");
  }
  for (const auto& k : s.skipped) {
    if (!t.as_json) {
      std::fprintf(stderr, "tune: adam mode %s skipped: %s\n",
                   k["adam_mode"].get<std::string>().c_str(),
                   k["reason"].get<std::string>().c_str());
    }
  }
  if (best == nullptr) {
    throw input_error("--hbm-budget", "no setting of the sweep fits in it",
                      std::to_string(t.hbm_budget_mib) + " MiB");
  }
  const tune_point* pick = best;
  for (const auto& p : sweep) {
    if ((budget == 0 || p.hbm <= budget) && p.step_s <= best->step_s * 1.02 && p.hbm < pick->hbm) {
      pick = &p;
    }
  }
  json rows = json::array();
  std::vector<double> errors;  // |predicted / measured - 1|
  for (const auto& p : sweep) {
    json row{{"window", p.window},      {"chunk_bytes", p.chunk},    {"adam_mode", p.mode},
             {"step_time_s", p.step_s}, {"stall_fraction", p.stall}, {"hbm_staging_bytes", p.hbm},
             {"pareto", p.pareto}};
    if (p.predicted_s != not_predicted) {
      row["predicted_step_time_s"] = p.predicted_s;
      row["prediction_error"] = p.predicted_s / p.step_s - 1;
      errors.push_back(std::fabs(p.predicted_s / p.step_s - 1));
    }
    rows.push_back(std::move(row));
  }
  json doc{{"workload", s.workload},
           {"predicted", t.model_only},
           {"steps_measured", t.model_only ? std::size_t{0} : t.measure_steps},
           {"hbm_budget_bytes", budget},
           {"recommended",
            {{"window", pick->window},
             {"chunk_bytes", pick->chunk},
             {"adam_mode", pick->mode},
             {"step_time_s", pick->step_s}}},
           {"best_step_time_s", best->step_s},
           {"sweep", rows},
           {"skipped", s.skipped}};
  if (!errors.empty()) {
    std::sort(errors.begin(), errors.end());
    const double median = errors.size() % 2 == 1
                              ? errors[errors.size() / 2]
                              : (errors[errors.size() / 2 - 1] + errors[errors.size() / 2]) / 2;
    s.model["median_abs_error"] = median;
    s.model["max_abs_error"] = errors.back();
  }
  if (!s.model.is_null()) {
    doc["model"] = s.model;
  }
  if (!t.html.empty()) {
    write_text_file(t.html, tune_html(sweep, *pick, s.workload_text, t.model_only));
    doc["html"] = t.html;
  }
  if (t.as_json) {
    std::printf("%s\n", doc.dump().c_str());
    return exit_ok;
  }
  if (t.model_only) {
    std::printf("predicted by the model (nothing was run but the link probe%s):\n",
                t.plan.empty() ? " and the calibration" : "");
  }
  const bool with_model = !errors.empty();
  std::printf("window  adam chunk    mode      step ms  %s stall %%  HBM staging  pareto\n",
              with_model ? "predicted ms  error %" : "");
  for (const auto& p : sweep) {
    std::printf("%6llu  %8.1f KiB  %-8s  %7.2f  ", static_cast<unsigned long long>(p.window),
                static_cast<double>(p.chunk) / 1024, p.mode.c_str(), p.step_s * 1e3);
    if (with_model) {
      std::printf("%12.2f  %7.1f ", p.predicted_s * 1e3, 100 * (p.predicted_s / p.step_s - 1));
    }
    std::printf("%7.1f  %8.2f MiB  %s\n", 100 * p.stall, static_cast<double>(p.hbm) / 1048576.0,
                p.pareto ? "*" : "");
  }
  if (pick->mode == "none") {
    std::printf("recommended: window %llu (step %.2f ms, best of the sweep %.2f ms)\n",
                static_cast<unsigned long long>(pick->window), pick->step_s * 1e3,
                best->step_s * 1e3);
  } else {
    std::printf(
        "recommended: --window %llu --adam-chunk %llu --adam-mode %s (step %.2f ms, best of "
        "the sweep %.2f ms)\n",
        static_cast<unsigned long long>(pick->window),
        static_cast<unsigned long long>(pick->chunk / sizeof(float)), pick->mode.c_str(),
        pick->step_s * 1e3, best->step_s * 1e3);
  }
  if (with_model) {
    std::printf("model: median |error| %.1f %%, max %.1f %%\n",
                100 * s.model["median_abs_error"].get<double>(),
                100 * s.model["max_abs_error"].get<double>());
  }
  if (!t.html.empty()) {
    std::printf("report: %s\n", t.html.c_str());
  }
  return exit_ok;
}

json links_json(const link_fits& links) {
  return {{"h2d", {{"gbps", links.h2d.gbps}, {"latency_s", links.h2d.latency_s}}},
          {"d2h", {{"gbps", links.d2h.gbps}, {"latency_s", links.d2h.latency_s}}},
          {"full_duplex", links.full_duplex},
          {"step_overhead_s", links.step_overhead_s}};
}

void progress(const tune_options& t, const tune_point& p) {
  if (t.as_json) {
    return;
  }
  std::fprintf(stderr, "tune: window %llu, adam chunk %llu B, %s: step %.2f ms, stall %.1f %%",
               static_cast<unsigned long long>(p.window), static_cast<unsigned long long>(p.chunk),
               p.mode.c_str(), p.step_s * 1e3, 100 * p.stall);
  if (p.predicted_s != not_predicted) {
    std::fprintf(stderr, ", predicted %.2f ms", p.predicted_s * 1e3);
  }
  std::fprintf(stderr, "\n");
}

tune_sweep sweep_demo(const tune_options& t, const std::vector<std::uint64_t>& windows) {
  const auto chunks = parse_list(t.chunks, "--adam-chunks", false);
  const auto modes = parse_modes(t.adam_modes);
  demo_options o = t.model;
  o.steps = t.warmup_steps + t.measure_steps;
  o.verify = false;
  o.log_every = 0;
  std::string note;
  auto dev = open_demo_device(o, note);
  const topology topo = topology::discover();
  const bool model = t.model_only || t.with_model;
  tune_sweep s;
  s.workload = {{"layers", o.layers}, {"width", o.width}, {"batch", o.batch}};
  s.workload_text = "the demo's model, " + std::to_string(o.layers) + " layers &times; " +
                    std::to_string(o.width) + ", batch " + std::to_string(o.batch) + ".";
  link_fits links;
  if (model) {
    links = probe_links(*dev);
    links.step_overhead_s = probe_step_overhead(*dev, topo, o);
    s.model = {{"links", links_json(links)},
               {"calibration", "per (Adam mode, chunk): " + std::to_string(calibration_warmup) +
                                   " + " + std::to_string(calibration_steps) + " steps at window " +
                                   std::to_string(windows.back()) + " less a run of the first " +
                                   std::to_string(calibration_warmup) +
                                   "; per-layer compute averaged over every calibration run; "
                                   "per (Adam mode, chunk), its last Adam step"}};
  }
  std::vector<demo_calibration> cals;  // one per (mode, chunk) that ran
  std::vector<std::size_t> cal_of_point;
  for (const auto& mode : modes) {
    const std::size_t mode_start = s.points.size();
    for (std::uint64_t c : chunks) {
      o.adam_chunk = c;
      o.adam_mode = mode;
      try {
        if (model) {
          o.window = windows.back();
          cals.push_back(calibrate_demo(o, *dev, topo));
          const auto& cal = cals.back();
          s.model["calibrated"].push_back(
              {{"adam_mode", cal.mode},
               {"chunk_bytes", c * sizeof(float)},
               {"compute_s", std::accumulate(cal.compute_s.begin(), cal.compute_s.end(), 0.0)},
               {"adam_step_s", cal.adam_s}});
        }
        for (std::uint64_t w : windows) {
          o.window = w;
          tune_point p;
          p.window = w;
          p.chunk = c * sizeof(float);
          if (model) {
            p.mode = cals.back().mode;
          }
          if (!t.model_only) {
            const run_result r = train(o, *dev, topo, false, true);
            p.mode = std::string(to_string(r.adam->mode));
            p.step_s = median_after(r.step_seconds, t.warmup_steps);
            p.stall = r.sched.stall_fraction;
            p.hbm = r.sched.hbm_staging_peak_bytes + r.adam->hbm_staging_peak_bytes +
                    r.adam->hbm_undo_bytes;
            progress(t, p);
          }
          s.points.push_back(p);
          cal_of_point.push_back(cals.size() - 1);  // unused without a model
        }
      } catch (const input_error&) {
        throw;
      } catch (const error& e) {  // e.g. streamed mode over params that live in host memory
        if (c != chunks.front() || s.points.size() != mode_start) {
          throw;  // it ran at the first setting: a failure now is not the mode's
        }
        s.skipped.push_back({{"adam_mode", mode}, {"reason", e.what()}});
        break;
      }
    }
  }
  if (cals.empty()) {
    return s;
  }
  // The layers' compute does not depend on the Adam chunk or mode: pool it over every
  // calibration run, so that one run on a busy machine does not move a whole line.
  std::vector<double> pooled(cals.front().compute_s.size(), 0.0);
  for (const auto& cal : cals) {
    for (std::size_t i = 0; i < pooled.size(); ++i) {
      pooled[i] += cal.compute_s[i] / static_cast<double>(cals.size());
    }
  }
  s.model["compute_s"] = std::accumulate(pooled.begin(), pooled.end(), 0.0);
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    tune_point& p = s.points[i];
    demo_calibration cal = cals[cal_of_point[i]];
    cal.compute_s = pooled;
    o.window = p.window;
    tune_point predicted_point = p;
    double predicted = 0;
    predict_demo(o, cal, links, predicted_point, predicted);
    if (t.model_only) {
      p = predicted_point;
      p.step_s = predicted;
      progress(t, p);
    } else {
      p.predicted_s = predicted;
    }
  }
  return s;
}

tune_sweep sweep_plan(const tune_options& t, const std::vector<std::uint64_t>& windows) {
  tune_plan tp = load_tune_plan(t.plan);
  std::uint64_t largest_budget = 0;
  for (std::uint64_t w : windows) {
    largest_budget = std::max(largest_budget, plan_staging_budget(tp, w));
  }
  tune_sweep s;
  s.workload = {{"plan", t.plan},
                {"buffers", tp.plan.buffers.size()},
                {"steps", tp.plan.steps.size()},
                {"bytes", tp.total_bytes}};
  s.workload_text = "the plan " + html_escape(t.plan) + ", " +
                    std::to_string(tp.plan.buffers.size()) + " buffers, " +
                    std::to_string(tp.plan.steps.size()) + " steps.";
  if (!t.model_only) {
    // Every buffer lives in host memory, and so does the emulated HBM: keep to half of RAM.
    const auto ram = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                     static_cast<std::uint64_t>(::sysconf(_SC_PAGE_SIZE));
    if (tp.total_bytes + largest_budget > ram / 2) {
      throw input_error(t.plan,
                        "running it needs " + format_byte_count(tp.total_bytes + largest_budget) +
                            " of host memory (buffers and emulated HBM), more than half of this "
                            "machine's " +
                            format_byte_count(ram) + "; --model-only predicts it without running");
    }
  }
  // The demo's device (same --emu-link / TIERFLOW_EMU_LINK handling): with a zero-width model
  // its HBM is the staging budget plus its fixed slack.
  demo_options o = t.model;
  o.width = 0;
  o.hbm_budget_mib = t.model_only ? 0 : static_cast<double>(largest_budget) / 1048576.0 + 1;
  std::string note;
  auto dev = open_demo_device(o, note);
  const topology topo = topology::discover();
  if (t.model_only || t.with_model) {
    link_fits links = probe_links(*dev);
    links.step_overhead_s = probe_step_overhead(*dev, topo, o);
    s.model = {{"links", links_json(links)}, {"calibration", "compute_ms of the plan"}};
    for (std::uint64_t w : windows) {
      tune_point p;
      p.window = w;
      p.mode = "none";
      predict_plan(tp, links, p, p.predicted_s);
      s.points.push_back(p);
    }
  }
  if (t.model_only) {
    for (auto& p : s.points) {
      p.step_s = p.predicted_s;
      p.predicted_s = not_predicted;
      progress(t, p);
    }
    return s;
  }
  plan_workload work(std::move(tp), topo, o);
  for (std::size_t i = 0; i < windows.size(); ++i) {
    tune_point p = run_plan(work, *dev, windows[i], t.warmup_steps, t.measure_steps);
    if (t.with_model) {
      p.predicted_s = s.points[i].predicted_s;
      s.points[i] = p;
    } else {
      s.points.push_back(p);
    }
    progress(t, p);
  }
  return s;
}

int run_tune(const tune_options& t) {
  const auto windows = parse_list(t.windows, "--windows", true);
  if (t.measure_steps == 0) {
    throw input_error("--steps", "must be > 0");
  }
  if (t.model_only && t.with_model) {
    throw input_error("--model-only", "cannot go with --with-model (which also runs the sweep)");
  }
  if (!t.html.empty()) {
    check_output_folder("--html", t.html);
  }
  tune_sweep s = t.plan.empty() ? sweep_demo(t, windows) : sweep_plan(t, windows);
  return report_tune(t, s);
}

}  // namespace

action add_demo_command(CLI::App& app) {
  auto o = std::make_shared<demo_options>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Train a dense stack with its weights streamed from a host tier and Adam offloaded");
  cmd->add_option("--layers", o->layers, "Dense layers")->capture_default_str();
  cmd->add_option("--width", o->width, "Units per layer")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Samples per step")->capture_default_str();
  cmd->add_option("--samples", o->samples, "Size of the fixed data set")->capture_default_str();
  cmd->add_option("--steps", o->steps, "Training steps")->capture_default_str();
  cmd->add_option("--window", o->window, "Prefetch window, in layers")->capture_default_str();
  cmd->add_option("--hbm-budget", o->hbm_budget_mib,
                  "HBM for staging weights, MiB (0: window + 2 layers)")
      ->capture_default_str();
  cmd->add_option("--adam-mode", o->adam_mode, "cpu, streamed or auto")->capture_default_str();
  cmd->add_option("--placement", o->placement,
                  "Placement spec, e.g. 'optimizer_state=cxl,dram' (else TIERFLOW_PLACEMENT)");
  cmd->add_option("--emu-link", o->emu_link,
                  "Emulated link, e.g. 'h2d=25GB/s,d2h=25GB/s,latency=10us' (else "
                  "TIERFLOW_EMU_LINK)");
  cmd->add_option("--device", o->device,
                  "auto (CUDA device 0 when usable, else emulated), cuda, cuda:N or emulated")
      ->capture_default_str();
  cmd->add_option("--lr", o->lr, "Adam learning rate")->capture_default_str();
  cmd->add_option("--adam-chunk", o->adam_chunk, "Elements per Adam chunk")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the data and the initial weights")
      ->capture_default_str();
  cmd->add_option("--log-every", o->log_every, "Progress line every N steps (0: none)")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Directory for metrics.json, trace.json, metrics.prom")
      ->capture_default_str();
  cmd->add_flag("--verify", o->verify,
                "Also train with everything resident in HBM and no offload; compare bit for bit");
  cmd->add_flag("--json", o->as_json, "Print one JSON object (last) instead of the summary");
  return [o] { return run_demo(*o); };
}

action add_tune_command(CLI::App& app) {
  auto t = std::make_shared<tune_options>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Sweep the prefetch window (and the Adam chunk and mode) on the demo's model or a plan "
      "file; measure or predict; recommend one");
  cmd->add_option("--plan", t->plan,
                  "Workload file (JSON: buffers and steps with compute_ms) instead of the demo's "
                  "model");
  cmd->add_option("--layers", t->model.layers, "Dense layers")->capture_default_str();
  cmd->add_option("--width", t->model.width, "Units per layer")->capture_default_str();
  cmd->add_option("--batch", t->model.batch, "Samples per step")->capture_default_str();
  cmd->add_option("--steps", t->measure_steps, "Steps measured per setting")->capture_default_str();
  cmd->add_option("--warmup", t->warmup_steps, "Steps run first, not measured")
      ->capture_default_str();
  cmd->add_option("--windows", t->windows, "Prefetch windows to try, in layers (plan: steps)")
      ->capture_default_str();
  cmd->add_option("--adam-chunks", t->chunks, "Adam chunk sizes to try, in elements (not --plan)")
      ->capture_default_str();
  cmd->add_option("--adam-modes", t->adam_modes,
                  "Adam modes to try: cpu, streamed, auto (not --plan)")
      ->capture_default_str();
  cmd->add_option("--hbm-budget", t->hbm_budget_mib,
                  "Recommend only settings whose HBM staging fits, MiB (0: any)")
      ->capture_default_str();
  cmd->add_option("--emu-link", t->model.emu_link, "Emulated link (else TIERFLOW_EMU_LINK)");
  cmd->add_option("--placement", t->model.placement, "Placement spec");
  cmd->add_flag("--model-only", t->model_only,
                "Predict the table from a link probe and compute times; run no sweep");
  cmd->add_flag("--with-model", t->with_model,
                "Run the sweep and the model; report the model's error per setting");
  cmd->add_flag("--json", t->as_json, "Print one JSON object");
  cmd->add_option("--html", t->html,
                  "Also write a page with step time and stall against the window (inline SVG)");
  return [t] {
    t->model.samples = std::max(t->model.samples, t->model.batch);
    return run_tune(*t);
  };
}

}  // namespace tierflow::cli
