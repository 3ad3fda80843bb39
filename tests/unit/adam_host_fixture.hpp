#pragma once
// The host-memory Adam tests' rig (test_adam_host_memory.cpp, test_adam_state.cpp): an emulated
// device, a placement without reserve, params and grads in host memory (CPU tensors) with the
// test's scalar reference of their state.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"

namespace tierflow::test::host_fixture {

inline std::unique_ptr<emulated_device> host_test_device() {
  emulated_device_options o;
  o.link = link_model::parse("h2d=40GB/s,d2h=40GB/s,latency=1us", "test");
  o.copy_threads = 1;
  o.hbm_bytes = std::uint64_t{256} << 20;
  return emulated_device::create(o);
}

inline placement_policy test_placement(const topology& topo) {
  placement_options o;
  o.reserve_bytes = 0;
  o.huge_pages = false;
  return placement_policy(topo, o);
}

// One param in host memory with its grad, and the test's scalar reference of its state.
struct host_param {
  param_dtype dtype = param_dtype::f32;
  std::vector<float> p32;           // fp32 param
  std::vector<std::uint16_t> p16;   // bf16 param
  std::vector<float> g;             // fp32 grads (f32 params)
  std::vector<std::uint16_t> g16;   // bf16 grads
  std::vector<float> master, m, v;  // the reference
  std::uint64_t steps = 0;

  host_param(param_dtype t, std::size_t n, std::mt19937_64& gen) : dtype(t) {
    std::normal_distribution<float> d(0.f, 1.f);
    master.resize(n);
    for (auto& x : master) {
      x = d(gen);
    }
    m.assign(n, 0.f);
    v.assign(n, 0.f);
    if (t == param_dtype::f32) {
      p32 = master;
      g.resize(n);
    } else {
      p16.resize(n);
      detail::store_params(adam_kernel::scalar, master.data(), p16.data(), t, n);
      detail::load_as_f32(p16.data(), t, master.data(), n);  // the master starts as the param
      g16.resize(n);
    }
  }
  [[nodiscard]] std::size_t size() const { return master.size(); }
  [[nodiscard]] void* param() {
    return dtype == param_dtype::f32 ? static_cast<void*>(p32.data()) : p16.data();
  }
  [[nodiscard]] const void* grad() const {
    return dtype == param_dtype::f32 ? static_cast<const void*>(g.data()) : g16.data();
  }
  void draw_grads(std::mt19937_64& gen) {
    std::normal_distribution<float> d(0.f, 0.1f);
    std::vector<float> fresh(size());
    for (auto& x : fresh) {
      x = d(gen);
    }
    if (dtype == param_dtype::f32) {
      g = fresh;
    } else {
      detail::store_params(adam_kernel::scalar, fresh.data(), g16.data(), dtype, size());
    }
  }
  // The step the scalar reference takes (no clip, loss scale 1).
  void reference_step(const adam_hyper& hyper) {
    const auto s = detail::make_adam_scalars(hyper, ++steps, 1.0);
    std::vector<float> gf(size());
    detail::load_as_f32(grad(), dtype, gf.data(), size());
    for (std::size_t i = 0; i < size(); ++i) {
      detail::adam_reference(master[i], m[i], v[i], gf[i], s);
    }
  }
  [[nodiscard]] std::vector<float> param_as_f32() const {
    std::vector<float> out(size());
    detail::load_as_f32(
        dtype == param_dtype::f32 ? static_cast<const void*>(p32.data()) : p16.data(), dtype,
        out.data(), size());
    return out;
  }
};

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One group over @p params (each param and grad where the test holds them), named
// @p prefix0, @p prefix1, ... (@p prefix alone for one param).
inline adam_group group_of(std::vector<host_param>& params, const std::string& prefix,
                           const adam_hyper& hyper = {}) {
  adam_group group;
  group.hyper = hyper;
  for (std::size_t i = 0; i < params.size(); ++i) {
    adam_param a;
    a.name = prefix + (params.size() > 1 ? std::to_string(i) : "");
    a.param = params[i].param();
    a.grad = params[i].grad();
    a.dtype = params[i].dtype;
    a.elements = params[i].size();
    group.params.push_back(a);
  }
  return group;
}

}  // namespace tierflow::test::host_fixture
