#pragma once
// The checks every numeric CLI flag goes through. CLI11 converts "-1" into an unsigned by
// wrapping it to 2^64 - 1, and reads "nan" and "inf" as doubles: these validators see the text
// first, so a flag's value is refused with one line `--FLAG: PROBLEM: 'TEXT'` (exit 2) before
// any conversion.

#include <cstdint>
#include <limits>

#include <CLI/CLI.hpp>

namespace tierflow::cli {

/** @brief A whole decimal number (no sign) from @p min to @p max: every count flag's check. */
[[nodiscard]] CLI::Validator count_in(
    std::uint64_t min, std::uint64_t max = std::numeric_limits<std::uint64_t>::max());

/** @brief A finite decimal number from @p min to @p max (no nan, no inf). */
[[nodiscard]] CLI::Validator number_in(double min, double max);

/** @brief The largest count a count flag takes unless it says otherwise: runs and sizes beyond
 *  it are typos, and sums of two such counts cannot wrap. */
inline constexpr std::uint64_t max_count = std::uint64_t{1} << 40;

}  // namespace tierflow::cli
