#include <array>
#include <utility>

#include "tierflow/detail/enum_names.hpp"
#include "tierflow/topology.hpp"

namespace tierflow {
namespace {
constexpr std::array<std::pair<tier_kind, std::string_view>, 5> tier_kind_names{{
    {tier_kind::hbm, "hbm"},
    {tier_kind::host_hbm, "host_hbm"},
    {tier_kind::dram, "dram"},
    {tier_kind::remote_dram, "remote_dram"},
    {tier_kind::cxl, "cxl"},
}};
}  // namespace

std::string_view to_string(tier_kind kind) noexcept {
  return detail::name_in(tier_kind_names, kind);
}

std::optional<tier_kind> parse_tier_kind(std::string_view name) noexcept {
  return detail::value_in<tier_kind>(tier_kind_names, name);
}

std::string_view to_string(attr_source source) noexcept {
  switch (source) {
    case attr_source::hmat:
      return "hmat";
    case attr_source::measured:
      return "measured";
    case attr_source::config:
      return "config";
    case attr_source::unknown:
      break;
  }
  return "unknown";
}

}  // namespace tierflow
