#pragma once
// The reliability tests' rig (test_adam_faults.cpp, test_soak.cpp): random offload_adam plans
// on an emulated device, grads drawn from a seed per step (so a faulty run and a fault-free
// reference see the same ones), the optimizer state as bytes, a scalar reference of the
// state, and the process's threads and resident memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <unistd.h>

#include "core/crc32c.hpp"
#include "test_support.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/tierflow.h"

namespace tierflow::test {

/** The shape of one optimizer: groups of params (dtype, size, where the param lives),
 *  hyper-parameters, options and the seed of its values. */
struct adam_plan {
  struct param {
    param_dtype dtype = param_dtype::f32;
    std::size_t elements = 0;
    bool on_host = false;
  };
  std::vector<std::vector<param>> groups;
  std::vector<adam_hyper> hyper;
  adam_options options;
  std::uint64_t seed = 0;

  [[nodiscard]] std::string describe() const {
    std::ostringstream out;
    out << to_string(options.mode) << ", chunk " << options.chunk_elements << ", window "
        << options.window << ", threads " << options.threads << ", kernel "
        << to_string(options.kernel) << ", clip " << options.max_grad_norm << ", loss scale "
        << options.loss_scale << ", groups";
    for (const auto& g : groups) {
      out << " [";
      for (std::size_t i = 0; i < g.size(); ++i) {
        out << (i == 0 ? "" : " ") << g[i].elements << "x" << to_string(g[i].dtype)
            << (g[i].on_host ? "@host" : "");
      }
      out << "]";
    }
    return out.str();
  }

  [[nodiscard]] std::size_t chunk_count(bool device_params_only) const {
    std::size_t n = 0;
    for (const auto& g : groups) {
      for (const auto& p : g) {
        if (!device_params_only || !p.on_host) {
          n += (p.elements + options.chunk_elements - 1) / options.chunk_elements;
        }
      }
    }
    return n;
  }
};

inline std::size_t uniform(std::mt19937_64& gen, std::size_t lo, std::size_t hi) {
  return std::uniform_int_distribution<std::size_t>(lo, hi)(gen);
}

inline std::vector<adam_kernel> kernels_here() {
  std::vector<adam_kernel> out;
  for (adam_kernel k : {adam_kernel::scalar, adam_kernel::avx2, adam_kernel::avx512}) {
    if (kernel_supported(k)) {
      out.push_back(k);
    }
  }
  return out;
}

/** A random plan for @p mode with params of at most @p max_elements. */
/** Random hyper-parameters across their useful ranges: lr 1e-4..1e-2, both decay modes, bias
 * correction on or off. */
inline adam_hyper random_hyper(std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  adam_hyper h;
  h.lr = std::pow(10.0, -4 + 2 * u(gen));
  h.beta1 = 0.8 + 0.19 * u(gen);
  h.beta2 = 0.95 + 0.0499 * u(gen);
  h.eps = std::pow(10.0, -9 + 3 * u(gen));
  h.weight_decay = u(gen) < 0.3 ? 0.0 : 0.1 * u(gen);
  h.decay = u(gen) < 0.5 ? weight_decay_mode::decoupled : weight_decay_mode::l2;
  h.bias_correction = u(gen) < 0.8;
  return h;
}

inline adam_plan random_adam_plan(std::mt19937_64& gen, adam_mode mode, std::size_t max_elements) {
  constexpr param_dtype dtypes[] = {param_dtype::f32, param_dtype::bf16, param_dtype::f16};
  adam_plan plan;
  plan.seed = gen();
  const std::size_t groups = uniform(gen, 1, 3);
  for (std::size_t g = 0; g < groups; ++g) {
    std::vector<adam_plan::param> params(uniform(gen, 1, 3));
    for (auto& p : params) {
      p.dtype = dtypes[uniform(gen, 0, 2)];
      p.elements = uniform(gen, 1, max_elements);
      p.on_host = mode == adam_mode::cpu && uniform(gen, 0, 5) == 0;
    }
    plan.groups.push_back(std::move(params));
    plan.hyper.push_back(random_hyper(gen));
  }
  plan.options.mode = mode;
  plan.options.chunk_elements = uniform(gen, 64, 2048);
  plan.options.threads = static_cast<unsigned>(uniform(gen, 1, 3));
  plan.options.window = uniform(gen, 0, 4);
  plan.options.max_grad_norm = uniform(gen, 0, 2) == 0 ? 2.0 : 0.0;
  plan.options.loss_scale = uniform(gen, 0, 2) == 0 ? 64.0 : 1.0;
  const auto kernels = kernels_here();
  plan.options.kernel = kernels[uniform(gen, 0, kernels.size() - 1)];
  return plan;
}

/** random_adam_plan() with every param on the device (none in host memory). */
inline adam_plan device_params_plan(std::mt19937_64& gen, adam_mode mode,
                                    std::size_t max_elements) {
  auto plan = random_adam_plan(gen, mode, max_elements);
  for (auto& g : plan.groups) {
    for (auto& p : g) {
      p.on_host = false;
    }
  }
  return plan;
}

/** The tests' emulated device: a fast link, one copy thread. */
inline emulated_device_options rig_device_options() {
  emulated_device_options o;
  o.link = link_model::parse("h2d=40GB/s,d2h=40GB/s,latency=1us", "test");
  o.copy_threads = 1;
  o.hbm_bytes = std::uint64_t{256} << 20;
  return o;
}

/** Host-only placement on this machine (no reserve, no huge pages). */
inline placement_policy rig_placement(const topology& topo) {
  placement_options o;
  o.reserve_bytes = 0;
  o.huge_pages = false;
  return placement_policy(topo, o);
}

/** Values of @p dtype as raw bytes, from fp32 values. */
inline std::vector<unsigned char> encode_values(const std::vector<float>& values,
                                                param_dtype dtype) {
  std::vector<unsigned char> out(values.size() * dtype_bytes(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == param_dtype::f32) {
      std::memcpy(&out[4 * i], &values[i], 4);
    } else {
      const std::uint16_t h = dtype == param_dtype::bf16 ? detail::float_to_bf16(values[i])
                                                         : detail::float_to_f16(values[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

/** Normal values, none of them zero. */
inline std::vector<float> nonzero_normals(std::size_t n, float scale, std::mt19937_64& gen) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    do {
      x = dist(gen);
    } while (x == 0.0f);
  }
  return v;
}

/**
 * An emulated device holding a plan's params and grads, and an offload_adam over them (built
 * by build(), so that construction failures can be tested). Two rigs of one plan start from
 * the same params and see the same grads at each step.
 */
class adam_rig {
 public:
  explicit adam_rig(const adam_plan& plan, emulated_device_options device = rig_device_options())
      : plan_(plan), dev_(emulated_device::create(device)) {
    auto gen = std::mt19937_64(plan.seed);
    for (const auto& g : plan.groups) {
      std::vector<tensor> ts;
      for (const auto& p : g) {
        tensor t;
        t.desc = p;
        t.bytes = p.elements * dtype_bytes(p.dtype);
        const auto init = encode_values(nonzero_normals(p.elements, 1.0f, gen), p.dtype);
        if (p.on_host) {
          t.host_copy = init;
          t.param = t.host_copy.data();
        } else {
          t.param = dev_->memory().allocate(t.bytes);
          std::memcpy(t.param, init.data(), t.bytes);  // emulated device memory is host memory
        }
        t.grad = dev_->memory().allocate(t.bytes);
        ts.push_back(std::move(t));
      }
      tensors_.push_back(std::move(ts));
    }
  }
  adam_rig(const adam_rig&) = delete;
  adam_rig& operator=(const adam_rig&) = delete;
  ~adam_rig() {
    opt_.reset();
    for (auto& g : tensors_) {
      for (auto& t : g) {
        if (!t.desc.on_host) {
          dev_->memory().deallocate(t.param, t.bytes);
        }
        dev_->memory().deallocate(t.grad, t.bytes);
      }
    }
  }

  /** Makes the optimizer (it throws what the constructor throws). */
  void build(placement_policy& placement) {
    std::vector<adam_group> groups;
    for (std::size_t g = 0; g < tensors_.size(); ++g) {
      adam_group ag;
      ag.hyper = plan_.hyper[g];
      for (std::size_t i = 0; i < tensors_[g].size(); ++i) {
        const auto& t = tensors_[g][i];
        adam_param p;
        p.name = "g" + std::to_string(g) + ".p" + std::to_string(i);
        p.param = t.param;
        p.grad = t.grad;
        p.dtype = t.desc.dtype;
        p.elements = t.desc.elements;
        p.param_on_host = t.desc.on_host;
        ag.params.push_back(std::move(p));
      }
      groups.push_back(std::move(ag));
    }
    opt_ = std::make_unique<offload_adam>(*dev_, std::move(groups), plan_.options, placement);
  }
  void destroy() { opt_.reset(); }

  [[nodiscard]] emulated_device& dev() { return *dev_; }
  [[nodiscard]] offload_adam& opt() { return *opt_; }
  [[nodiscard]] const adam_plan& plan() const { return plan_; }
  /** Param @p i of group @p g's grad (device memory; host-addressable on the emulated device). */
  [[nodiscard]] void* grad(std::size_t g, std::size_t i) const { return tensors_[g][i].grad; }

  /** Writes the grads of step @p step (0-based), the same for every rig of this plan. */
  void set_grads(std::uint64_t step) {
    for (std::size_t g = 0; g < tensors_.size(); ++g) {
      for (std::size_t i = 0; i < tensors_[g].size(); ++i) {
        const auto raw = grads_of(step, g, i);
        std::memcpy(tensors_[g][i].grad, raw.data(), raw.size());
      }
    }
  }

  /** The grads of step @p step for param @p i of group @p g, in its dtype. */
  [[nodiscard]] std::vector<unsigned char> grads_of(std::uint64_t step, std::size_t g,
                                                    std::size_t i) const {
    auto gen =
        std::mt19937_64(plan_.seed ^ (0x9e3779b97f4a7c15ULL * (step + 1)) ^ (g << 40) ^ (i << 48));
    const auto scale = static_cast<float>(0.3 * plan_.options.loss_scale);
    return encode_values(nonzero_normals(tensors_[g][i].desc.elements, scale, gen),
                         tensors_[g][i].desc.dtype);
  }

  /** The state as bytes: every param's master weights, m and v, then each group's steps. */
  [[nodiscard]] std::vector<unsigned char> state() const {
    std::vector<unsigned char> out;
    const auto append = [&out](const void* p, std::size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      out.insert(out.end(), b, b + n);
    };
    for (std::size_t g = 0; g < tensors_.size(); ++g) {
      for (std::size_t i = 0; i < tensors_[g].size(); ++i) {
        for (const auto& v :
             {opt_->master_weights(g, i), opt_->exp_avg(g, i), opt_->exp_avg_sq(g, i)}) {
          append(v.data(), v.size() * sizeof(float));
        }
      }
      const std::uint64_t steps = opt_->step_count(g);
      append(&steps, sizeof steps);
    }
    return out;
  }

  /** The params as the device (or the host, for params on the host) holds them. */
  [[nodiscard]] std::vector<unsigned char> params() const {
    std::vector<unsigned char> out;
    for (const auto& g : tensors_) {
      for (const auto& t : g) {
        const auto* b = static_cast<const unsigned char*>(t.param);
        out.insert(out.end(), b, b + t.bytes);
      }
    }
    return out;
  }

  /**
   * The master weights, m and v after @p steps fault-free steps, by the scalar reference
   * (detail::adam_reference), for a plan without clipping. Same layout as state().
   */
  [[nodiscard]] std::vector<unsigned char> reference_state(std::uint64_t steps) const {
    std::vector<unsigned char> out;
    for (std::size_t g = 0; g < tensors_.size(); ++g) {
      for (std::size_t i = 0; i < tensors_[g].size(); ++i) {
        const auto& t = tensors_[g][i];
        const std::size_t n = t.desc.elements;
        auto gen = std::mt19937_64(plan_.seed);
        // The params of earlier tensors come first in the seed's sequence.
        std::vector<float> p;
        for (std::size_t gg = 0; gg <= g; ++gg) {
          for (std::size_t ii = 0; ii < tensors_[gg].size(); ++ii) {
            const auto& o = tensors_[gg][ii];
            auto values = nonzero_normals(o.desc.elements, 1.0f, gen);
            if (gg == g && ii == i) {
              p = decoded(encode_values(values, o.desc.dtype), o.desc.dtype);
              break;
            }
          }
          if (!p.empty()) {
            break;
          }
        }
        std::vector<float> m(n, 0.0f), v(n, 0.0f);
        for (std::uint64_t s = 0; s < steps; ++s) {
          const auto grads = decoded(grads_of(s, g, i), t.desc.dtype);
          const auto scalars =
              detail::make_adam_scalars(plan_.hyper[g], s + 1, 1.0 / plan_.options.loss_scale);
          for (std::size_t e = 0; e < n; ++e) {
            detail::adam_reference(p[e], m[e], v[e], grads[e], scalars);
          }
        }
        for (const auto* vec : {&p, &m, &v}) {
          const auto* b = reinterpret_cast<const unsigned char*>(vec->data());
          out.insert(out.end(), b, b + n * sizeof(float));
        }
      }
      const std::uint64_t count = steps;
      const auto* b = reinterpret_cast<const unsigned char*>(&count);
      out.insert(out.end(), b, b + sizeof count);
    }
    return out;
  }

 private:
  struct tensor {
    adam_plan::param desc;
    std::size_t bytes = 0;
    void* param = nullptr;
    void* grad = nullptr;
    std::vector<unsigned char> host_copy;  // the param, for params on the host
  };

  static std::vector<float> decoded(const std::vector<unsigned char>& raw, param_dtype dtype) {
    const std::size_t n = raw.size() / dtype_bytes(dtype);
    std::vector<float> out(n);
    detail::load_as_f32(raw.data(), dtype, out.data(), n);
    return out;
  }

  adam_plan plan_;
  std::unique_ptr<emulated_device> dev_;
  std::vector<std::vector<tensor>> tensors_;
  std::unique_ptr<offload_adam> opt_;  // before the tensors' device memory goes
};

/** CRC32C of @p bytes, for messages. */
inline std::uint32_t checksum(const std::vector<unsigned char>& bytes) {
  return detail::crc32c(bytes.data(), bytes.size());
}

/** A line of /proc/self/status (e.g. `Threads:`, `VmLck:`) as a number, 0 if absent. */
inline std::uint64_t proc_status_value(const std::string& key) {
  std::istringstream in(read_file("/proc/self/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      return std::stoull(line.substr(key.size()));
    }
  }
  return 0;
}

/** Threads of this process now. The first thread a process starts also starts a sanitizer's
 * own background thread (ThreadSanitizer's): one thread is started and joined first, so that
 * a count taken before a test's threads and one taken after them compare alike. */
inline std::uint64_t thread_count() {
  static const bool settled = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)settled;
  return proc_status_value("Threads:");
}

/** The thread count, waiting up to 2 s while it is above @p expected: a joined thread can be
 *  counted for a moment after pthread_join returns (the kernel reaps it after it wakes the
 *  joiner), which a loaded machine makes visible. A thread left running stays counted. */
inline std::uint64_t thread_count_after_joins(std::uint64_t expected) {
  std::uint64_t n = thread_count();
  for (int i = 0; i < 200 && n > expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = thread_count();
  }
  return n;
}

/** Resident set size of this process now, in bytes (/proc/self/statm). */
inline std::uint64_t resident_bytes() {
  std::istringstream in(read_file("/proc/self/statm"));
  std::uint64_t size = 0;
  std::uint64_t resident = 0;
  in >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

/** tf_adam_options' defaults in cpu mode on 1 thread (the C-ABI tests' usual optimizer). */
inline tf_adam_options c_cpu_options() {
  tf_adam_options o;
  tf_adam_options_default(&o);
  o.mode = TF_ADAM_CPU;
  o.threads = 1;
  return o;
}

/** Through the C ABI: a fresh emulated device, one f32 param "w" with @p values and a grad with
 *  @p grads (same size), and a cpu-mode tf_adam over it on 1 thread. All freed at scope end. */
class c_adam_one_param {
 public:
  c_adam_one_param(const std::vector<float>& values, const std::vector<float>& grads)
      : n_(values.size()) {
    REQUIRE(grads.size() == n_);
    REQUIRE(tf_device_open("emulated", &dev_) == TF_OK);
    REQUIRE(tf_device_alloc(dev_, n_ * 4, &param_) == TF_OK);
    REQUIRE(tf_device_alloc(dev_, n_ * 4, &grad_) == TF_OK);
    REQUIRE(tf_device_copy(dev_, param_, values.data(), n_ * 4, TF_COPY_H2D) == TF_OK);
    REQUIRE(tf_device_copy(dev_, grad_, grads.data(), n_ * 4, TF_COPY_H2D) == TF_OK);
    tf_adam_hyper hyper;
    tf_adam_hyper_default(&hyper);
    const tf_adam_options o = c_cpu_options();
    const tf_adam_param p{"w", param_, grad_, TF_DTYPE_F32, n_, 0, 0};
    REQUIRE(tf_adam_create(dev_, &p, 1, &hyper, 1, &o, &adam_) == TF_OK);
  }
  c_adam_one_param(const c_adam_one_param&) = delete;
  c_adam_one_param& operator=(const c_adam_one_param&) = delete;
  ~c_adam_one_param() {
    tf_adam_destroy(adam_);
    if (dev_ != nullptr) {
      (void)tf_device_free(dev_, param_, n_ * 4);
      (void)tf_device_free(dev_, grad_, n_ * 4);
      tf_device_destroy(dev_);
    }
  }
  [[nodiscard]] tf_adam* adam() const noexcept { return adam_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  std::size_t n_;
  tf_device* dev_ = nullptr;
  void* param_ = nullptr;
  void* grad_ = nullptr;
  tf_adam* adam_ = nullptr;
};

}  // namespace tierflow::test
