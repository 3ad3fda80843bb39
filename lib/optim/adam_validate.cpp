// offload_adam's argument checks: the hypers, the options against what they multiply into, and
// the params' and grads' memory ranges (adam_internal.hpp declares them; docs/bad-input.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "optim/adam_core.hpp"
#include "optim/adam_internal.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/error.hpp"
#include "tierflow/offload_adam.hpp"

namespace tierflow {

namespace detail {

void check_hyper(const adam_hyper& h, const std::string& where) {
  const auto fail = [&](const std::string& what, double value) {
    throw error("offload_adam: " + where + ": " + what + ", not " + number(value));
  };
  if (!std::isfinite(h.lr) || h.lr < 0) {
    fail("invalid learning rate: lr must be finite and >= 0", h.lr);
  }
  if (!(h.beta1 >= 0 && h.beta1 < 1)) {
    fail("invalid betas: beta1 must be in [0, 1)", h.beta1);
  }
  if (!(h.beta2 >= 0 && h.beta2 < 1)) {
    fail("invalid betas: beta2 must be in [0, 1)", h.beta2);
  }
  if (!std::isfinite(h.eps) || h.eps <= 0) {
    fail("invalid eps: eps must be finite and > 0", h.eps);
  }
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0) {
    fail("invalid weight_decay: weight_decay must be finite and >= 0", h.weight_decay);
  }
  if (h.decay != weight_decay_mode::decoupled && h.decay != weight_decay_mode::l2) {
    throw error("offload_adam: " + where + ": unknown weight decay mode");
  }
  // The kernels take these rounded to float (adam_scalars): a value finite in double can be
  // inf or 0 there and poison the state while the step says "applied".
  constexpr double float_max = std::numeric_limits<float>::max();
  if (h.eps > float_max || static_cast<float>(h.eps) <= 0.0f) {
    fail("eps must be finite as a float (the kernels' precision) and not round to 0 there", h.eps);
  }
  if (h.lr / (1.0 - h.beta1) > float_max) {
    fail("lr / (1 - beta1), the first step's size, must be finite as a float", h.lr);
  }
  if (h.weight_decay > float_max || h.lr * h.weight_decay > float_max) {
    fail("weight_decay and lr * weight_decay must be finite as floats", h.weight_decay);
  }
}

void check_options(adam_options& options, const std::vector<adam_group>& in) {
  const auto fail = [](const std::string& what, double value) {
    throw error("offload_adam: " + what + ", not " + number(value));
  };
  if (options.chunk_elements == 0) {
    throw error("offload_adam: chunk_elements must be > 0");
  }
  if (options.overlap != adam_overlap::none && options.overlap != adam_overlap::backward &&
      options.overlap != adam_overlap::backward_publish) {
    throw error("offload_adam: unknown overlap");
  }
  // Grads are scaled by clip / loss_scale as a float: both it and its inverse must be finite.
  constexpr double float_max = std::numeric_limits<float>::max();
  if (!std::isfinite(options.loss_scale) || options.loss_scale <= 0 ||
      options.loss_scale > float_max || 1.0 / options.loss_scale > float_max) {
    fail("loss_scale must be finite and > 0, and it and 1 / loss_scale finite as floats",
         options.loss_scale);
  }
  if (!std::isfinite(options.max_grad_norm) || options.max_grad_norm < 0 ||
      options.max_grad_norm > float_max) {
    fail("max_grad_norm must be finite (as a float) and >= 0 (0: no clipping)",
         options.max_grad_norm);
  }
  for (double rate : {options.h2d_gbps, options.d2h_gbps, options.host_memory_gbps}) {
    if (!std::isfinite(rate) || rate < 0) {
      throw error("offload_adam: measured rates must be finite and >= 0 (0: unknown)");
    }
  }
  // The timeout becomes nanoseconds in 64 bits: beyond ~292 years it wrapped and steps timed
  // out at once.
  if (!std::isfinite(options.device_timeout_s) || options.device_timeout_s < 0 ||
      options.device_timeout_s > max_device_timeout_s) {
    fail("device_timeout_s must be finite, >= 0 (0: wait forever) and at most " +
             number(max_device_timeout_s),
         options.device_timeout_s);
  }
  if (options.threads > max_adam_threads()) {
    fail("threads must be at most " + std::to_string(max_adam_threads()) +
             " (4 x the hardware threads, at most 1024; 0: the CPUs near the state)",
         options.threads);
  }
  // A chunk is the unit of every per-chunk buffer (staging, rings): one longer than the
  // largest param only pins memory, and a huge one wrapped their byte sizes. check_hyper and
  // the per-param checks bound the element counts, so the clamped chunk's products fit.
  std::size_t largest = 0;
  for (const auto& g : in) {
    for (const auto& p : g.params) {
      largest = std::max(largest, p.elements);
    }
  }
  // int8 moments have a scale per block of state_block elements: a chunk holds whole blocks.
  const bool int8 = std::any_of(in.begin(), in.end(), [&](const adam_group& g) {
    return g.state_dtype.value_or(options.state_dtype) == adam_state_dtype::int8;
  });
  if (int8 && options.chunk_elements % state_block != 0) {
    options.chunk_elements = std::min(options.chunk_elements, largest);
    options.chunk_elements += (state_block - options.chunk_elements % state_block) % state_block;
  }
  if (largest > 0) {
    options.chunk_elements = std::min(options.chunk_elements, largest);
  }
  if (options.master != adam_master::fp32 && options.master != adam_master::remainder) {
    throw error("offload_adam: options.master is not an adam_master");
  }
  if (options.master == adam_master::remainder && options.mode == adam_mode::streamed) {
    throw error(
        "offload_adam: master 'remainder' needs the cpu step (the params in host memory, "
        "written in place); mode streamed keeps them on the device: use mode cpu or auto");
  }
  if (options.master == adam_master::remainder && options.overlap != adam_overlap::none) {
    throw error("offload_adam: master 'remainder' with overlap " +
                std::string(to_string(options.overlap)) +
                ": not built (an overlap updates ahead of step() and keeps an undo copy of the "
                "master, and a split master is the param itself); use overlap none or master "
                "'fp32'");
  }
  for (std::size_t gi = 0; gi < in.size(); ++gi) {
    const adam_state_dtype dtype = in[gi].state_dtype.value_or(options.state_dtype);
    if (dtype != adam_state_dtype::f32 && dtype != adam_state_dtype::bf16 &&
        dtype != adam_state_dtype::int8) {
      throw error("offload_adam: group " + std::to_string(gi) + ": unknown state_dtype");
    }
  }
}

void check_no_overlap(const std::vector<adam_group>& in) {
  // Every param is written by the step and every grad read by it: a param that overlaps another
  // param or any grad (a grad pointer equal to its param, a view into another tensor) would
  // have them corrupt each other silently.
  struct range {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    bool param = false;
    std::string what;
  };
  std::vector<range> ranges;
  for (std::size_t gi = 0; gi < in.size(); ++gi) {
    for (std::size_t pi = 0; pi < in[gi].params.size(); ++pi) {
      const adam_param& p = in[gi].params[pi];
      const std::string what = "group " + std::to_string(gi) + " param " + std::to_string(pi) +
                               (p.name.empty() ? "" : " '" + p.name + "'");
      const std::size_t bytes = p.elements * dtype_bytes(p.dtype);
      const std::pair<const void*, bool> pointers[] = {{p.param, true}, {p.grad, false}};
      for (const auto& [pointer, is_param] : pointers) {
        if (pointer == nullptr) {
          continue;  // a grad given later, with each step
        }
        const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
        if (begin + bytes < begin) {
          throw error("offload_adam: " + what + ": its " + (is_param ? "param" : "grad") +
                      " range wraps the address space");
        }
        ranges.push_back(
            {begin, begin + bytes, is_param, what + (is_param ? " (param)" : " (grad)")});
      }
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const range& a, const range& b) { return a.begin < b.begin; });
  const range* furthest_param = nullptr;
  const range* furthest_any = nullptr;
  for (const auto& r : ranges) {
    const range* other = r.param ? furthest_any : furthest_param;
    if (other != nullptr && other->end > r.begin) {
      throw error("offload_adam: " + r.what + " overlaps " + other->what +
                  ": a param may share memory with no other param and no grad");
    }
    if (r.param && (furthest_param == nullptr || r.end > furthest_param->end)) {
      furthest_param = &r;
    }
    if (furthest_any == nullptr || r.end > furthest_any->end) {
      furthest_any = &r;
    }
  }
}

unsigned max_adam_threads() noexcept {
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1024u : std::min(1024u, 4u * hardware);
}

}  // namespace detail

}  // namespace tierflow
