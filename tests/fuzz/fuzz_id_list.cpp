// Linux id lists (`0-3,8`): whatever parses must survive format and parse again unchanged.
#include <cstdlib>

#include "fuzz_support.hpp"
#include "tierflow/detail/parse.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto text = tierflow::fuzz::text_of(data, size);
  const auto ids = tierflow::detail::parse_id_list(text, 4096);
  if (ids) {
    const auto again =
        tierflow::detail::parse_id_list(tierflow::detail::format_id_list(*ids), 4096);
    if (!again || *again != *ids) {
      std::abort();
    }
  }
  (void)tierflow::detail::parse_u64(text);
  (void)tierflow::detail::parse_i64(text);
  return 0;
}
