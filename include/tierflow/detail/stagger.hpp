#pragma once
// Where to start arrays that one loop streams together, so that no two of them sit at equal
// addresses modulo the aliasing span: on the CPUs measured (BENCHMARKS.md, "Address
// aliasing"), four fp32 streams exactly 256 MiB apart run the Adam step ~2.5 x slower, with
// 4 KiB and 2 MiB pages alike, and a 4 KiB stagger removes it. Consecutive large mmaps land
// exactly that far apart, so an allocator that knows nothing of the others puts them there.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tierflow::detail {

/** @brief Addresses equal modulo this many bytes alias. */
inline constexpr std::size_t alias_span = std::size_t{256} << 20;
/** @brief The stagger's unit, and the least distance kept modulo alias_span. */
inline constexpr std::size_t stagger_step = 8192;
/** @brief The offsets tried: 0, stagger_step, ... below stagger_slack. */
inline constexpr std::size_t stagger_slack = 32 * stagger_step;
/** @brief Arrays smaller than this are not staggered: their aliasing costs little, and the
 *  slack would cost more than it saves over many small params. */
inline constexpr std::size_t stagger_min_bytes = std::size_t{1} << 20;

/** @brief The distance of @p a from @p b modulo alias_span (0 .. alias_span / 2). */
[[nodiscard]] std::size_t alias_distance(std::uintptr_t a, std::uintptr_t b) noexcept;

/**
 * @brief The offset (a multiple of stagger_step below stagger_slack) at which an array whose
 *        memory starts at @p base keeps at least stagger_step from every address in @p apart
 *        modulo alias_span; the address chosen is appended to @p apart.
 *
 * The first offset that does, else the one farthest from its nearest (only with more than
 * ~15 addresses in @p apart). The caller allocates stagger_slack bytes beyond the array.
 */
std::size_t stagger_offset(const void* base, std::vector<std::uintptr_t>& apart);

}  // namespace tierflow::detail
