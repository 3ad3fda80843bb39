#pragma once
/** @file
 * @brief Small text parsers shared by every reader of sysfs, env vars and config files.
 *
 * They return std::nullopt on malformed text and never throw; the caller knows where the text
 * came from and turns the failure into a tierflow::input_error.
 */

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tierflow::detail {

/** @brief @p text without leading and trailing spaces, tabs and newlines. */
[[nodiscard]] std::string_view trim(std::string_view text) noexcept;

/** @brief Splits @p text at each @p separator (empty fields are kept). */
[[nodiscard]] std::vector<std::string_view> split(std::string_view text, char separator);

/** @brief A whole unsigned decimal number (surrounding blanks allowed), or nullopt. */
[[nodiscard]] std::optional<std::uint64_t> parse_u64(std::string_view text) noexcept;

/** @brief A whole signed decimal number (surrounding blanks allowed), or nullopt. */
[[nodiscard]] std::optional<std::int64_t> parse_i64(std::string_view text) noexcept;

/**
 * @brief A Linux list of ids such as `0-3,8,10-11` (sysfs cpulist/nodelist format), sorted
 * and without duplicates. An empty (or blank) text is the empty list. Returns nullopt on
 * malformed text, a reversed range or an id above @p max_id.
 */
[[nodiscard]] std::optional<std::vector<int>> parse_id_list(std::string_view text,
                                                            int max_id = 1 << 20);

/** @brief @p value rounded up to a multiple of @p unit (> 0); wraps to a smaller number on
 *  overflow, which callers check (`result < value`). */
[[nodiscard]] constexpr std::size_t round_up(std::size_t value, std::size_t unit) noexcept {
  return (value + unit - 1) / unit * unit;
}

/** @brief @p value × @p numerator / @p denominator, rounded down, without overflow when
 *  numerator ≤ denominator. */
[[nodiscard]] constexpr std::uint64_t scale(std::uint64_t value, std::uint64_t numerator,
                                            std::uint64_t denominator) noexcept {
  return value / denominator * numerator + value % denominator * numerator / denominator;
}

/** @brief Formats ids as a compact Linux list (`0-3,8`). */
[[nodiscard]] std::string format_id_list(const std::vector<int>& ids);

}  // namespace tierflow::detail
