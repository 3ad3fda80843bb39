// Configuration files: `key = value` lines.
#include "fuzz_support.hpp"
#include "tierflow/settings.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tierflow::fuzz::expect_clean([&] {
    const auto s = tierflow::settings::from_text(tierflow::fuzz::text_of(data, size), "fuzz.conf");
    (void)s.get("tiers");
    (void)s.get("placement");
  });
  return 0;
}
