// The CUDA backend on a real GPU: properties, copies from registered tier memory, events,
// host callbacks, errors, the transfer engine's routes, and offload_adam's streamed step (its
// CUDA kernels, each state dtype) against the cpu step. Without a usable GPU it reports
// SKIPPED with the reason and exits with the code CTest counts as skipped.

#define CATCH_CONFIG_RUNNER
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/device.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"
#include "tierflow/transfer_engine.hpp"

using namespace tierflow;

namespace {

constexpr int skip_return_code = 77;
constexpr std::size_t mib = std::size_t{1} << 20;
std::uint64_t seed = 0;

}  // namespace

TEST_CASE("cuda device properties", "[cuda]") {
  auto dev = open_device("cuda");
  const auto& p = dev->properties();
  CHECK(p.backend == "cuda");
  CHECK_FALSE(p.name.empty());
  CHECK(p.memory_total_bytes > (std::uint64_t{1} << 30));
  CHECK(p.copy_engines >= 1);
  CHECK(p.pci_bus_id.size() == 12);
  const auto free_bytes = dev->memory_free_bytes();
  CHECK(free_bytes > 0);
  CHECK(free_bytes <= p.memory_total_bytes);
}

TEST_CASE("cuda copies from registered NUMA memory are bit-exact", "[cuda]") {
  auto dev = open_device("cuda");
  std::mt19937_64 gen(seed);
  numa_resource_options on_node0;
  on_node0.nodes = {numa_node_id{0}};
  on_node0.populate = true;
  numa_resource node0(on_node0);
  pinned_resource registered(node0, dev->host_registration());
  for (int round = 0; round < 5; ++round) {
    const auto bytes = std::uniform_int_distribution<std::size_t>(1, 64 * mib + 77)(gen);
    const auto data = tierflow::test::random_bytes(bytes, gen);
    auto* host = static_cast<unsigned char*>(registered.allocate(bytes));
    std::memcpy(host, data.data(), bytes);
    void* d = dev->memory().allocate(bytes);
    void* d2 = dev->memory().allocate(bytes);
    dev->copy_async(d, host, bytes, copy_kind::h2d, dev->h2d_stream());
    auto e = dev->create_event();
    dev->h2d_stream().record(*e);
    dev->compute_stream().wait(*e);
    dev->copy_async(d2, d, bytes, copy_kind::d2d, dev->compute_stream());
    dev->compute_stream().record(*e);
    dev->d2h_stream().wait(*e);
    std::memset(host, 0, bytes);
    dev->copy_async(host, d2, bytes, copy_kind::d2h, dev->d2h_stream());
    dev->d2h_stream().synchronize();
    INFO("bytes " << bytes);
    CHECK(std::memcmp(host, data.data(), bytes) == 0);
    dev->memory().deallocate(d, bytes);
    dev->memory().deallocate(d2, bytes);
    registered.deallocate(host, bytes);
  }
}

TEST_CASE("cuda events and host callbacks keep order", "[cuda]") {
  auto dev = open_device("cuda");
  auto start = dev->create_event();
  auto ready = dev->create_event();
  CHECK(ready->query());
  std::atomic<bool> produced{false};
  std::atomic<bool> seen{false};
  dev->compute_stream().record(*start);
  dev->compute_stream().host_callback([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    produced = true;
  });
  dev->compute_stream().record(*ready);
  dev->h2d_stream().wait(*ready);
  dev->h2d_stream().host_callback([&] { seen = produced.load(); });
  dev->h2d_stream().synchronize();
  CHECK(seen.load());
  CHECK(event::elapsed_ms(*start, *ready) >= 25.0);
  dev->compute_stream().host_callback([] { throw std::runtime_error("callback failed"); });
  CHECK_THROWS_WITH(dev->compute_stream().synchronize(), Catch::Contains("callback failed"));
  dev->compute_stream().synchronize();  // reported, so cleared
}

TEST_CASE("cuda errors are typed and name the call", "[cuda]") {
  auto dev = open_device("cuda");
  try {
    (void)dev->memory().allocate(std::size_t{1} << 50);  // 1 PiB
    FAIL("no error");
  } catch (const out_of_capacity& e) {
    CHECK_THAT(e.what(), Catch::Contains("cuda hbm"));
  }
  CHECK_THROWS_AS(open_device("cuda:999"), device_error);
}

TEST_CASE("transfer engine routes on cuda", "[cuda]") {
  auto dev = open_device("cuda");
  transfer_engine engine(*dev, transfer_options{4 * mib, 4});
  std::mt19937_64 gen(seed + 1);
  const std::size_t bytes = 96 * mib + 5;
  const auto data = tierflow::test::random_bytes(bytes, gen);
  std::vector<unsigned char> back(bytes, 0);
  void* d = dev->memory().allocate(bytes);
  engine.copy(d, memory_space::device, data.data(), memory_space::host, bytes)->synchronize();
  engine.copy(back.data(), memory_space::host, d, memory_space::device, bytes)->synchronize();
  CHECK(back == data);
  CHECK(engine.link("h2d").bytes == bytes);
  CHECK(engine.link("h2d").achieved_gbps() > 1.0);
  dev->memory().deallocate(d, bytes);
}

TEST_CASE("offload_adam streamed on cuda: fp32, bf16 and int8 moments give the cpu step's bits",
          "[cuda]") {
  auto dev = open_device("cuda");
  std::mt19937_64 gen(seed + 2);
  const topology topo = topology::discover();
  placement_options po;
  po.reserve_bytes = 0;
  po.huge_pages = false;
  placement_policy placement(topo, po);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (adam_state_dtype dtype :
       {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    for (param_dtype pd : {param_dtype::f32, param_dtype::bf16}) {
      INFO(to_string(dtype) << " moments, " << to_string(pd) << " params");
      const std::size_t n = 300000 + gen() % 100000;
      const std::size_t bytes = n * dtype_bytes(pd);
      std::vector<float> values(n);
      for (auto& x : values) {
        x = normal(gen);
      }
      std::vector<unsigned char> host_p(bytes), host_g(bytes);
      detail::store_params(adam_kernel::scalar, values.data(), host_p.data(), pd, n);
      // Two optimizers, one per mode, each over its own device param and the same grads.
      void* p[2] = {dev->memory().allocate(bytes), dev->memory().allocate(bytes)};
      void* g = dev->memory().allocate(bytes);
      for (void* d : p) {
        dev->copy_async(d, host_p.data(), bytes, copy_kind::h2d, dev->h2d_stream());
      }
      dev->h2d_stream().synchronize();
      std::vector<std::unique_ptr<offload_adam>> opt;
      for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
        adam_param a;
        a.name = "w";
        a.param = p[opt.size()];
        a.grad = g;
        a.dtype = pd;
        a.elements = n;
        adam_group group;
        group.params.push_back(a);
        group.hyper.lr = 1e-2;
        group.hyper.weight_decay = 0.01;
        adam_options o;
        o.mode = mode;
        o.state_dtype = dtype;
        o.chunk_elements = 65536;
        opt.push_back(
            std::make_unique<offload_adam>(*dev, std::vector<adam_group>{group}, o, placement));
        REQUIRE(opt.back()->mode() == mode);
      }
      for (int step = 0; step < 4; ++step) {
        for (auto& x : values) {
          x = 0.1f * normal(gen);
        }
        detail::store_params(adam_kernel::scalar, values.data(), host_g.data(), pd, n);
        dev->copy_async(g, host_g.data(), bytes, copy_kind::h2d, dev->h2d_stream());
        dev->h2d_stream().synchronize();
        REQUIRE(opt[0]->step().applied);
        REQUIRE(opt[1]->step().applied);
      }
      CHECK(opt[0]->master_weights(0, 0) == opt[1]->master_weights(0, 0));
      CHECK(opt[0]->exp_avg(0, 0) == opt[1]->exp_avg(0, 0));
      CHECK(opt[0]->exp_avg_sq(0, 0) == opt[1]->exp_avg_sq(0, 0));
      std::vector<unsigned char> back[2] = {std::vector<unsigned char>(bytes),
                                            std::vector<unsigned char>(bytes)};
      for (int k = 0; k < 2; ++k) {
        dev->copy_async(back[k].data(), p[k], bytes, copy_kind::d2h, dev->d2h_stream());
      }
      dev->d2h_stream().synchronize();
      CHECK(back[0] == back[1]);
      opt.clear();
      for (void* d : {p[0], p[1], g}) {
        dev->memory().deallocate(d, bytes);
      }
    }
  }
}

int main(int argc, char** argv) {
  std::string why;
  try {
    auto dev = open_device("cuda");
  } catch (const std::exception& e) {
    std::printf("SKIPPED: %s\n", e.what());
    return skip_return_code;
  }
  seed = std::random_device{}();
  std::printf("cuda device tests: seed %llu\n", static_cast<unsigned long long>(seed));
  return Catch::Session().run(argc, argv);
}
