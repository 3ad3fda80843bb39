// The measured-attribute cache of `tierflow bench` (docs/measured-cache.md): a file anyone can
// edit. What parses must survive a round trip through the writer unchanged.
#include <cstdlib>
#include <string>

#include "fuzz_support.hpp"
#include "topology/measured_cache.hpp"

namespace {

bool same(const tierflow::measured_access& a, const tierflow::measured_access& b) {
  return a.initiator == b.initiator && a.target == b.target &&
         a.read_bandwidth_mbps == b.read_bandwidth_mbps &&
         a.write_bandwidth_mbps == b.write_bandwidth_mbps && a.read_latency_ns == b.read_latency_ns;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tierflow::fuzz::expect_clean([&] {
    std::string key;
    const auto values = tierflow::detail::parse_measured_cache(tierflow::fuzz::text_of(data, size),
                                                               "fuzz.txt", key);
    std::string again_key;
    const auto again = tierflow::detail::parse_measured_cache(
        tierflow::detail::format_measured_cache(key, values), "round trip", again_key);
    if (again_key != key || again.size() != values.size()) {
      std::abort();
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!same(values[i], again[i])) {
        std::abort();
      }
    }
  });
  return 0;
}
