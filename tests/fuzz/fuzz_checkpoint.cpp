// The offload_adam checkpoint loader: any file is either refused with input_error (and the
// live state stays as it was) or loaded. One optimizer of a fixed shape (a bf16 and an fp32
// parameter, deterministic values) on the emulated device takes every input. With
// TIERFLOW_FUZZ_SEED_OUT=PATH set, it first saves its own checkpoint there (the corpus seed).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <unistd.h>

#include "fuzz_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

namespace {

struct fixture {
  std::unique_ptr<tierflow::emulated_device> dev;
  tierflow::topology topo = tierflow::topology::discover();
  std::unique_ptr<tierflow::placement_policy> placement;
  void* params[2] = {};
  void* grads[2] = {};
  std::unique_ptr<tierflow::offload_adam> opt;
  std::vector<float> master;  // the state loads must either replace wholly or leave alone
  std::string path;

  fixture() {
    tierflow::emulated_device_options eo;
    eo.link = tierflow::link_model::parse("h2d=100GB/s,d2h=100GB/s,latency=0us", "fuzz");
    eo.copy_threads = 1;
    dev = tierflow::emulated_device::create(eo);
    tierflow::placement_options po;
    po.reserve_bytes = 0;
    po.huge_pages = false;
    placement = std::make_unique<tierflow::placement_policy>(topo, po);
    const std::size_t n[2] = {300, 37};
    const std::size_t bytes[2] = {n[0] * 2, n[1] * 4};
    for (int i = 0; i < 2; ++i) {
      params[i] = dev->memory().allocate(bytes[i]);
      grads[i] = dev->memory().allocate(bytes[i]);
      auto* p = static_cast<unsigned char*>(params[i]);
      auto* g = static_cast<unsigned char*>(grads[i]);
      for (std::size_t b = 0; b < bytes[i]; ++b) {  // emulated device memory is host memory
        p[b] = static_cast<unsigned char>(b % 2 == 1 ? 0x3f : (b * 37) & 0xff);
        g[b] = static_cast<unsigned char>(b % 2 == 1 ? 0x3a : (b * 11) & 0xff);
      }
    }
    std::vector<tierflow::adam_group> groups(1);
    groups[0].params.push_back({"w", params[0], grads[0], tierflow::param_dtype::bf16, n[0]});
    groups[0].params.push_back({"b", params[1], grads[1], tierflow::param_dtype::f32, n[1]});
    tierflow::adam_options o;
    o.mode = tierflow::adam_mode::cpu;
    o.chunk_elements = 128;
    o.threads = 1;
    opt = std::make_unique<tierflow::offload_adam>(*dev, groups, o, *placement);
    (void)opt->step();
    if (const char* seed = std::getenv("TIERFLOW_FUZZ_SEED_OUT"); seed != nullptr) {
      opt->save(seed);
    }
    master = opt->master_weights(0, 0);
    path = (std::filesystem::temp_directory_path() /
            ("tierflow-fuzz-checkpoint-" + std::to_string(::getpid()) + ".tfck"))
               .string();
  }
};

fixture& the_fixture() {
  static fixture f;
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fixture& f = the_fixture();
  if (std::FILE* out = std::fopen(f.path.c_str(), "wb"); out != nullptr) {
    if (size > 0) {
      std::fwrite(data, 1, size, out);
    }
    std::fclose(out);
  }
  bool loaded = true;
  tierflow::fuzz::expect_clean([&] {
    try {
      f.opt->load(f.path);
    } catch (const tierflow::input_error&) {
      loaded = false;
      throw;
    }
  });
  if (!loaded && f.opt->master_weights(0, 0) != f.master) {
    std::abort();  // a refused file changed the state
  }
  if (loaded) {
    f.master = f.opt->master_weights(0, 0);
  }
  std::remove(f.path.c_str());
  return 0;
}
