// Links against an installed tierflow: classifies a fake sysfs tree given on the command line
// (printing the tier names for the calling test to check), then places a buffer on this
// machine and checks where its pages are.
#include <cstdio>
#include <exception>

#include <tierflow/tierflow.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer SYSFS_ROOT\n");
    return 2;
  }
  try {
    tierflow::discovery_options options;
    options.sysfs_root = argv[1];
    const auto fake = tierflow::topology::discover(options);
    for (const auto& tier : fake.tiers()) {
      std::printf("%s ", tier.name.c_str());
    }
    std::printf("\n");

    tierflow::numa_resource_options on_node0;
    on_node0.nodes = {tierflow::numa_node_id{0}};
    on_node0.populate = true;
    tierflow::numa_resource node0(on_node0);
    tierflow::pinned_resource pinned(node0);
    tierflow::pool_resource staging(pinned);
    constexpr std::size_t bytes = 8 << 20;
    void* buffer = staging.allocate(bytes);
    const auto pages = tierflow::where(buffer, bytes);
    staging.deallocate(buffer, bytes);
    if (pages.pages_on(0) != pages.total_pages) {
      std::fprintf(stderr, "consumer: %zu of %zu pages on node 0\n", pages.pages_on(0),
                   pages.total_pages);
      return 1;
    }
    tierflow::placement_policy policy(tierflow::topology::discover());
    auto state = policy.allocate(tierflow::data_class::optimizer_state, bytes);
    if (state.tier().empty() || tierflow::to_json(policy.snapshot()).empty()) {
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
