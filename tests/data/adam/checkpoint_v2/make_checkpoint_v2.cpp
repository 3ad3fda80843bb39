// Writes checkpoint_v2.tfck: an offload_adam checkpoint in format version 2, made by the
// writer that wrote version 2 (lib/optim/adam_checkpoint.cpp up to commit 8731e1b; its save is
// that of 324da61). test_adam_checkpoint_v3.cpp loads it and recomputes its values from the
// same rules (rules.json says them). Not built by CMake; from the repository root,
// with a build of such a commit in BUILD:
//   g++ -std=c++20 -Iinclude -IBUILD/include -Ilib -Itests/unit \
//     tests/data/adam/checkpoint_v2/make_checkpoint_v2.cpp BUILD/libtierflow.a \
//     -lhwloc -lnuma -lpthread -ldl -lrt [-L/usr/local/cuda/lib -lcudart_static] -o make_v2
//   ./make_v2 tests/data/adam/checkpoint_v2/checkpoint_v2.tfck
#include <cstdint>
#include <cstdio>
#include <vector>

#include "adam_host_fixture.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;

namespace {

// Exact fp32 values from integers: the start of element i of param k.
float start_value(std::size_t k, std::size_t i) {
  return static_cast<float>(static_cast<long>((i * 7919 + k * 101) % 2001) - 1000) / 512.0f;
}

// Element i of param k's grad at step t.
float grad_value(std::size_t k, std::size_t i, int t) {
  return static_cast<float>(static_cast<long>((i * 31 + k * 13 + t * 977) % 401) - 200) / 4096.0f;
}

struct param_spec {
  const char* name;
  param_dtype dtype;
  std::size_t elements;
  std::size_t group;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.tfck\n", argv[0]);
    return 2;
  }
  const param_spec specs[] = {{"w", param_dtype::f32, 5000, 0},
                              {"n", param_dtype::f32, 300, 0},
                              {"e", param_dtype::bf16, 4500, 1}};
  std::vector<std::vector<float>> p32(3), g32(3);
  std::vector<std::vector<std::uint16_t>> p16(3), g16(3);
  std::vector<adam_group> groups(2);
  groups[0].hyper.lr = 1e-2;
  groups[0].hyper.weight_decay = 0.05;
  groups[1].hyper.lr = 3e-3;
  groups[1].hyper.beta1 = 0.8;
  groups[1].hyper.weight_decay = 0.01;
  groups[1].hyper.decay = weight_decay_mode::l2;
  for (std::size_t k = 0; k < 3; ++k) {
    const std::size_t n = specs[k].elements;
    p32[k].resize(n);
    g32[k].resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      p32[k][i] = start_value(k, i);
    }
    adam_param a;
    a.name = specs[k].name;
    a.dtype = specs[k].dtype;
    a.elements = n;
    if (specs[k].dtype == param_dtype::bf16) {
      p16[k].resize(n);
      g16[k].resize(n);
      detail::store_params(adam_kernel::scalar, p32[k].data(), p16[k].data(), param_dtype::bf16, n);
      a.param = p16[k].data();
      a.grad = g16[k].data();
    } else {
      a.param = p32[k].data();
      a.grad = g32[k].data();
    }
    groups[specs[k].group].params.push_back(a);
  }
  auto dev = test::host_fixture::host_test_device();
  const topology topo = topology::discover();
  auto policy = test::host_fixture::test_placement(topo);
  adam_options o;
  o.mode = adam_mode::cpu;
  o.threads = 1;
  o.chunk_elements = 2048;
  offload_adam opt(*dev, groups, o, policy);
  for (int t = 1; t <= 3; ++t) {
    for (std::size_t k = 0; k < 3; ++k) {
      for (std::size_t i = 0; i < specs[k].elements; ++i) {
        g32[k][i] = grad_value(k, i, t);
      }
      if (specs[k].dtype == param_dtype::bf16) {
        detail::store_params(adam_kernel::scalar, g32[k].data(), g16[k].data(), param_dtype::bf16,
                             specs[k].elements);
      }
    }
    if (!opt.step().applied) {
      return 1;
    }
  }
  opt.save(argv[1]);
  return 0;
}
