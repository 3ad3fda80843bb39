#pragma once
// The checks every numeric CLI flag goes through. CLI11 converts "-1" into an unsigned by
// wrapping it to 2^64 - 1, and reads "nan" and "inf" as doubles: these validators see the text
// first, so a flag's value is refused with one line `--FLAG: PROBLEM: 'TEXT'` (exit 2) before
// any conversion.

#include <cstdint>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

namespace tierflow::cli {

/** @brief A whole decimal number (no sign) from @p min to @p max: every count flag's check. */
[[nodiscard]] CLI::Validator count_in(
    std::uint64_t min, std::uint64_t max = std::numeric_limits<std::uint64_t>::max());

/** @brief A finite decimal number from @p min to @p max (no nan, no inf). A value too small
 *  for a normal double (1e-320) is taken as the subnormal strtod makes of it and checked
 *  against the range like any other; one beyond double (1e400, 1e-400) is refused. */
[[nodiscard]] CLI::Validator number_in(double min, double max);

/** @brief A value that is not empty (nor only blanks): `--tiers ''` was taken as "not given".
 *  @p without says what leaving the flag out does, for the message. */
[[nodiscard]] CLI::Validator non_empty(const std::string& without);

/** @brief A number flag's value as its errors echo it: `%g` (1e-300, not 0.000000). */
[[nodiscard]] std::string flag_number_text(double value);

/** @brief The largest count a count flag takes unless it says otherwise: runs and sizes beyond
 *  it are typos, and sums of two such counts cannot wrap. */
inline constexpr std::uint64_t max_count = std::uint64_t{1} << 40;

}  // namespace tierflow::cli
