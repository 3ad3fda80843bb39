// The user's spec strings: TIERFLOW_TIERS (tier overrides), TIERFLOW_PLACEMENT and
// TIERFLOW_EMU_LINK. The first byte picks which parser gets the rest.
#include "fuzz_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"

namespace {
const tierflow::topology& machine() {
  static const tierflow::topology topo = [] {
    tierflow::discovery_options o;
    o.sysfs_root = TIERFLOW_FUZZ_DATA_DIR "/sysfs/two_socket_cxl";
    return tierflow::topology::discover(o);
  }();
  return topo;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const std::string text(tierflow::fuzz::text_of(data + 1, size - 1));
  switch (data[0] % 3) {
    case 0:
      tierflow::fuzz::expect_clean([&] {
        tierflow::discovery_options o;
        o.sysfs_root = TIERFLOW_FUZZ_DATA_DIR "/sysfs/two_socket_cxl";
        o.tiers_override = text;
        (void)tierflow::topology::discover(o);
      });
      break;
    case 1:
      tierflow::fuzz::expect_clean(
          [&] { (void)tierflow::placement_spec::parse(text, "fuzz", machine()); });
      break;
    default:
      tierflow::fuzz::expect_clean([&] { (void)tierflow::link_model::parse(text, "fuzz"); });
  }
  return 0;
}
