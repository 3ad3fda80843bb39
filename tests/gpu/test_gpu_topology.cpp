// Needs a GPU: the CUDA runtime's devices appear as hbm tiers with their real capacity and a
// PCI bus id. Without a GPU (or built without CUDA) it reports SKIPPED with the reason, and
// exits with the code CTest counts as skipped.

#define CATCH_CONFIG_RUNNER
#include <cstdio>

#include <catch2/catch.hpp>

#include "tierflow/topology.hpp"

namespace {
constexpr int skip_return_code = 77;
}

TEST_CASE("each CUDA device is an hbm tier", "[cuda]") {
  tierflow::discovery_options options;
  options.query_gpu_free_memory = true;
  const auto topo = tierflow::topology::discover(options);
  int hbm = 0;
  for (const auto& t : topo.tiers()) {
    if (t.kind != tierflow::tier_kind::hbm) {
      continue;
    }
    ++hbm;
    REQUIRE(t.gpu >= 0);
    const auto& gpu = topo.gpus().at(static_cast<std::size_t>(t.gpu));
    CHECK(gpu.cuda_index >= 0);
    CHECK_FALSE(gpu.name.empty());
    CHECK(gpu.pci_bus_id.size() == 12);  // 0000:17:00.0
    CHECK(t.capacity_bytes == gpu.memory_total_bytes);
    CHECK(t.capacity_bytes > (1ULL << 30));
    REQUIRE(t.free_bytes.has_value());
    CHECK(*t.free_bytes <= t.capacity_bytes);
    CHECK(*t.free_bytes > 0);
  }
  CHECK(hbm > 0);
  CHECK_THAT(topo.gpu_status(), Catch::Contains("GPU(s) visible to CUDA"));
}

int main(int argc, char** argv) {
  tierflow::discovery_options options;
  options.use_hwloc = false;
  const auto topo = tierflow::topology::discover(options);
  bool visible = false;
  for (const auto& gpu : topo.gpus()) {
    visible = visible || gpu.cuda_index >= 0;
  }
  if (!visible) {
    std::printf("SKIPPED: %s\n", topo.gpu_status().c_str());
    return skip_return_code;
  }
  return Catch::Session().run(argc, argv);
}
