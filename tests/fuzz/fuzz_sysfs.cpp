// sysfs text: the input replaces one file of a copy of a fake tree (the first byte picks
// which), and discovery must either classify the tree or reject it with input_error.
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "fuzz_support.hpp"
#include "tierflow/topology.hpp"

namespace fs = std::filesystem;

namespace {
const fs::path& tree() {
  static const fs::path root = [] {
    const fs::path dir =
        fs::temp_directory_path() / ("tierflow-fuzz-sysfs-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::copy(TIERFLOW_FUZZ_DATA_DIR "/sysfs/two_socket_cxl", dir,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    return dir;
  }();
  return root;
}

constexpr const char* files[] = {
    "sys/devices/system/node/online",
    "sys/devices/system/node/has_memory",
    "sys/devices/system/node/has_cpu",
    "sys/devices/system/node/node0/meminfo",
    "sys/devices/system/node/node2/meminfo",
    "sys/devices/system/node/node1/distance",
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/virtual/memory_tiering/memory_tier22/nodelist",
    "sys/devices/system/node/node2/access0/initiators/read_bandwidth",
    "sys/bus/dax/devices/dax0.0/target_node",
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const auto file = tree() / files[data[0] % std::size(files)];
  std::string original;
  {
    std::ifstream in(file, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  tierflow::fuzz::expect_clean([] {
    tierflow::discovery_options o;
    o.sysfs_root = tree();
    auto topo = tierflow::topology::discover(o);
    topo.refresh_memory();
  });
  std::ofstream(file, std::ios::binary | std::ios::trunc) << original;
  return 0;
}
