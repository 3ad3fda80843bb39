// Links against an installed tierflow and classifies a fake sysfs tree given on the command
// line; prints the tier names so the calling test can check them.
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
    const auto topo = tierflow::topology::discover(options);
    for (const auto& tier : topo.tiers()) {
      std::printf("%s ", tier.name.c_str());
    }
    std::printf("\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
