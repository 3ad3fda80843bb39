// hwloc XML input (`tierflow topo --hwloc-xml FILE`): written to a file and discovered.
#include <filesystem>
#include <fstream>

#include <hwloc.h>
#include <unistd.h>

#include "fuzz_support.hpp"
#include "tierflow/topology.hpp"

// One topology kept for the whole run keeps hwloc's plugins (libxml2) loaded, so a leak inside
// them is attributed to them (and suppressed, lsan.supp) instead of to an unloaded module.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static hwloc_topology_t keep_plugins_loaded = nullptr;
  hwloc_topology_init(&keep_plugins_loaded);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto path = std::filesystem::temp_directory_path() /
                           ("tierflow-fuzz-" + std::to_string(::getpid()) + ".xml");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  tierflow::fuzz::expect_clean([] {
    tierflow::discovery_options o;
    o.hwloc_xml = path;
    (void)tierflow::topology::discover(o);
  });
  return 0;
}
