#pragma once
// CRC-32C (Castagnoli) for checksumming files tierflow writes, such as checkpoints.

#include <cstddef>
#include <cstdint>

namespace tierflow::detail {

/**
 * @brief CRC-32C (reflected polynomial 0x82F63B78) of @p bytes bytes at @p data.
 *
 * The initial and final XOR with 0xFFFFFFFF happen inside, so results chain: pass the CRC of
 * what came before as @p crc (0 to start), and `crc32c(b, nb, crc32c(a, na))` is the CRC of
 * a followed by b. Uses the SSE4.2 CRC32 instruction when the CPU has it (checked once, at run
 * time), else crc32c_software.
 */
[[nodiscard]] std::uint32_t crc32c(const void* data, std::size_t bytes,
                                   std::uint32_t crc = 0) noexcept;

/** @brief The same CRC as crc32c, always computed with tables (slicing by 8). */
[[nodiscard]] std::uint32_t crc32c_software(const void* data, std::size_t bytes,
                                            std::uint32_t crc = 0) noexcept;

/** @brief Whether crc32c uses the CPU's CRC32 instruction on this machine. */
[[nodiscard]] bool crc32c_hardware_available() noexcept;

}  // namespace tierflow::detail
