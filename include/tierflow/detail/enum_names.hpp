#pragma once
/** @file
 * @brief Lookups in a table of (enum value, stable name) pairs, both ways.
 */

#include <optional>
#include <string_view>
#include <utility>

namespace tierflow::detail {

/** @brief The name of @p value in @p table, or `unknown`. */
template <typename Enum, typename Table>
[[nodiscard]] constexpr std::string_view name_in(const Table& table, Enum value) noexcept {
  for (const auto& [e, name] : table) {
    if (e == value) {
      return name;
    }
  }
  return "unknown";
}

/** @brief The value named @p name in @p table, or nullopt. */
template <typename Enum, typename Table>
[[nodiscard]] constexpr std::optional<Enum> value_in(const Table& table,
                                                     std::string_view name) noexcept {
  for (const auto& [e, known] : table) {
    if (known == name) {
      return e;
    }
  }
  return std::nullopt;
}

}  // namespace tierflow::detail
