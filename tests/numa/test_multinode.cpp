// Placement across several NUMA nodes, proven with where(). Needs a machine (or the QEMU
// harness) with two or more memory nodes; elsewhere it reports SKIPPED with the reason and
// exits with the code CTest counts as skipped.

#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <cstdio>

#include <catch2/catch.hpp>

#include "tierflow/numa_resource.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"
#include "tierflow/where.hpp"

using namespace tierflow;

namespace {

constexpr int skip_return_code = 77;
constexpr std::size_t mib = std::size_t{1} << 20;

std::vector<numa_node_id> memory_nodes() {
  std::vector<numa_node_id> ids;
  const auto topo = topology::discover();
  for (const auto& n : topo.nodes()) {
    ids.push_back(n.id);
  }
  return ids;
}

page_residency populate_and_locate(numa_resource& resource, std::size_t bytes, void*& p) {
  p = resource.allocate(bytes);
  return where(p, bytes);
}

}  // namespace

TEST_CASE("bind puts every page on the node asked for", "[numa][multinode]") {
  for (const auto& node : memory_nodes()) {
    numa_resource_options o;
    o.nodes = {node};
    o.populate = true;
    numa_resource resource(o);
    void* p = nullptr;
    const auto r = populate_and_locate(resource, 32 * mib, p);
    INFO("node " << node.value);
    CHECK(r.pages_on(node.value) == r.total_pages);
    resource.deallocate(p, 32 * mib);
  }
}

TEST_CASE("preferred puts pages on the preferred node", "[numa][multinode]") {
  const auto nodes = memory_nodes();
  numa_resource_options o;
  o.nodes = {nodes.back()};
  o.policy = numa_policy::preferred;
  o.populate = true;
  numa_resource resource(o);
  void* p = nullptr;
  const auto r = populate_and_locate(resource, 16 * mib, p);
  CHECK(r.pages_on(nodes.back().value) == r.total_pages);
  resource.deallocate(p, 16 * mib);
}

TEST_CASE("interleave spreads pages evenly", "[numa][multinode]") {
  const auto nodes = memory_nodes();
  numa_resource_options o;
  o.nodes = nodes;
  o.policy = numa_policy::interleave;
  o.populate = true;
  o.huge_pages = false;
  numa_resource resource(o);
  // Where THP is always on, interleave goes by 2 MiB pages: make that a small error.
  const std::size_t bytes = 96 * mib * nodes.size();
  void* p = nullptr;
  const auto r = populate_and_locate(resource, bytes, p);
  for (const auto& node : nodes) {
    const double share =
        static_cast<double>(r.pages_on(node.value)) / static_cast<double>(r.total_pages);
    INFO("node " << node.value << " share " << share);
    CHECK(share == Approx(1.0 / static_cast<double>(nodes.size())).margin(0.02));
  }
  resource.deallocate(p, bytes);
}

TEST_CASE("weighted interleave honours weights (kernel or split)", "[numa][multinode]") {
  const auto nodes = memory_nodes();
  const std::vector<numa_node_id> pair = {nodes[0], nodes[1]};
  for (bool kernel_weights : {true, false}) {
    numa_resource_options o;
    o.nodes = pair;
    o.policy = numa_policy::weighted_interleave;
    o.populate = true;
    if (!kernel_weights) {
      o.weights = {3, 1};
    }
    numa_resource resource(o);
    const std::size_t bytes = 128 * mib;
    void* p = nullptr;
    const auto r = populate_and_locate(resource, bytes, p);
    const double first =
        static_cast<double>(r.pages_on(pair[0].value)) / static_cast<double>(r.total_pages);
    INFO(resource.effective_policy() << ": first node share " << first);
    CHECK(r.pages_on(pair[0].value) + r.pages_on(pair[1].value) == r.total_pages);
    if (!kernel_weights) {
      CHECK(resource.effective_policy() == "weighted_interleave (user-space split)");
      CHECK(first == Approx(0.75).margin(0.03));
    } else {
      CHECK(first > 0.0);
      CHECK(first < 1.0);
    }
    resource.deallocate(p, bytes);
  }
}

TEST_CASE("placement puts each tier's bytes on its nodes", "[numa][multinode][placement]") {
  const auto topo = topology::discover();
  for (const auto& t : topo.tiers()) {
    if (t.nodes.empty()) {
      continue;
    }
    placement_options options;
    options.spec = "activations=" + t.name;
    placement_policy one_tier(topo, options);
    auto a = one_tier.allocate(data_class::activations, 8 * mib);
    const auto r = where(a.data(), a.size());
    std::size_t on_tier = 0;
    for (const auto& n : t.nodes) {
      on_tier += r.pages_on(n.value);
    }
    INFO("tier " << t.name);
    CHECK(on_tier == r.total_pages);
  }
}

TEST_CASE("a full tier spills to the next, and each allocation lands where it says",
          "[numa][multinode][placement]") {
  const auto topo = topology::discover();
  // The two host tiers with the least free memory: the first of them is filled.
  std::vector<const tier*> host;
  for (const auto& t : topo.tiers()) {
    if (!t.nodes.empty() && t.free_bytes) {
      host.push_back(&t);
    }
  }
  REQUIRE(host.size() >= 2);
  std::sort(host.begin(), host.end(),
            [](const tier* a, const tier* b) { return *a->free_bytes < *b->free_bytes; });
  const tier& first = *host[0];
  const tier& second = *host[1];
  placement_options options;
  options.spec = "optimizer_state=" + first.name + "," + second.name;
  options.reserve_bytes = 64 * mib;
  constexpr std::uint64_t real_fill_limit = std::uint64_t{2} << 30;
  if (*first.free_bytes > real_fill_limit) {
    options.tier_limits[first.name] = 256 * mib;  // a big machine: cap it instead of filling it
  }
  placement_policy policy(topo, options);
  std::vector<tier_allocation> held;
  const std::size_t chunk = 32 * mib;
  while (held.empty() || held.back().tier() == first.name) {
    held.push_back(policy.allocate(data_class::optimizer_state, chunk));
    REQUIRE(held.size() < 200);
  }
  INFO(held.size() - 1 << " allocations in " << first.name << " before the spill");
  CHECK(held.size() >= 3);
  CHECK(held.back().tier() == second.name);
  for (const auto& a : held) {
    const auto& t = a.tier() == first.name ? first : second;
    const auto r = where(a.data(), a.size());
    std::size_t on_tier = 0;
    for (const auto& n : t.nodes) {
      on_tier += r.pages_on(n.value);
    }
    CHECK(on_tier == r.total_pages);
  }
  const auto snap = policy.snapshot();
  for (const auto& u : snap.tiers) {
    if (u.tier == first.name) {
      CHECK(u.spills_out >= 1);
    }
    if (u.tier == second.name) {
      CHECK(u.spills_in == 1);
    }
  }
}

int main(int argc, char** argv) {
  const auto nodes = memory_nodes();
  if (nodes.size() < 2) {
    std::printf(
        "SKIPPED: this machine has %zu memory node(s); these tests need 2 or more "
        "(run them in the multi-node VM harness)\n",
        nodes.size());
    return skip_return_code;
  }
  return Catch::Session().run(argc, argv);
}
