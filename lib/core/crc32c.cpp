#include "core/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)  // _mm_crc32_u64 needs 64-bit mode
#include <nmmintrin.h>
#define TIERFLOW_CRC32C_X86 1
#endif

namespace tierflow::detail {
namespace {

// Everything below works on the raw CRC register: crc32c() applies the XOR with 0xFFFFFFFF on
// the way in and out, which is what lets callers chain results.

constexpr std::uint32_t polynomial = 0x82f63b78u;  // Castagnoli, bit-reflected

using crc_table = std::array<std::array<std::uint32_t, 256>, 8>;

// Slicing by 8: tables[k][b] is the register after byte b followed by k zero bytes, so eight
// input bytes are folded in with eight independent lookups instead of a chain of eight.
constexpr crc_table make_tables() {
  crc_table t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) {
      c = (c >> 1) ^ ((c & 1u) != 0 ? polynomial : 0u);
    }
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t b = 0; b < 256; ++b) {
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
    }
  }
  return t;
}

constexpr crc_table tables = make_tables();

// Little-endian loads assembled from bytes: correct on any host, and one plain load on x86.
inline std::uint32_t load_le32(const unsigned char* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

std::uint32_t software(const unsigned char* p, std::size_t n, std::uint32_t state) noexcept {
  for (; n >= 8; p += 8, n -= 8) {
    const std::uint32_t low = state ^ load_le32(p);
    const std::uint32_t high = load_le32(p + 4);
    state = tables[7][low & 0xffu] ^ tables[6][(low >> 8) & 0xffu] ^
            tables[5][(low >> 16) & 0xffu] ^ tables[4][low >> 24] ^ tables[3][high & 0xffu] ^
            tables[2][(high >> 8) & 0xffu] ^ tables[1][(high >> 16) & 0xffu] ^
            tables[0][high >> 24];
  }
  for (; n > 0; ++p, --n) {
    state = (state >> 8) ^ tables[0][(state ^ *p) & 0xffu];
  }
  return state;
}

#if TIERFLOW_CRC32C_X86

// One CRC32 instruction has a latency of about three cycles but a throughput of one per cycle,
// so a single dependency chain runs at a third of the possible speed. Long inputs are cut into
// rounds of three lanes of lane_bytes each, checksummed side by side, and the lanes are joined
// by advancing a register over lane_bytes zero bytes (the CRC is linear, so the register after
// A then B is the register after A advanced over |B| zeros, XOR B's register from zero).
constexpr std::size_t lane_bytes = 1024;

using shift_table = std::array<std::array<std::uint32_t, 256>, 4>;

// shift[k][b] is register value b << 8k advanced over lane_bytes zero bytes; advancing any
// register is the XOR of its four bytes' entries. Built from the images of the 32 single bits.
constexpr shift_table make_shift_table() {
  std::array<std::uint32_t, 32> bit_image{};
  for (std::size_t bit = 0; bit < 32; ++bit) {
    std::uint32_t c = std::uint32_t{1} << bit;
    for (std::size_t i = 0; i < lane_bytes; ++i) {
      c = (c >> 8) ^ tables[0][c & 0xffu];
    }
    bit_image[bit] = c;
  }
  shift_table s{};
  for (std::size_t k = 0; k < 4; ++k) {
    for (std::size_t b = 0; b < 256; ++b) {
      std::uint32_t image = 0;
      for (std::size_t bit = 0; bit < 8; ++bit) {
        if (((b >> bit) & 1u) != 0) {
          image ^= bit_image[8 * k + bit];
        }
      }
      s[k][b] = image;
    }
  }
  return s;
}

constexpr shift_table shift = make_shift_table();

inline std::uint32_t advance_one_lane(std::uint32_t c) noexcept {
  return shift[0][c & 0xffu] ^ shift[1][(c >> 8) & 0xffu] ^ shift[2][(c >> 16) & 0xffu] ^
         shift[3][c >> 24];
}

inline std::uint64_t load_u64(const unsigned char* p) noexcept {
  std::uint64_t word = 0;
  std::memcpy(&word, p, 8);  // x86 is little-endian, as the instruction expects
  return word;
}

__attribute__((target("sse4.2"))) std::uint32_t hardware(const unsigned char* p, std::size_t n,
                                                         std::uint32_t state) noexcept {
  std::uint64_t a = state;
  for (; n >= 3 * lane_bytes; p += 3 * lane_bytes, n -= 3 * lane_bytes) {
    std::uint64_t b = 0;
    std::uint64_t c = 0;
    for (std::size_t i = 0; i < lane_bytes; i += 8) {
      a = _mm_crc32_u64(a, load_u64(p + i));
      b = _mm_crc32_u64(b, load_u64(p + lane_bytes + i));
      c = _mm_crc32_u64(c, load_u64(p + 2 * lane_bytes + i));
    }
    // The instruction leaves the upper half of its 64-bit result zero, so these are exact.
    const std::uint32_t ab =
        advance_one_lane(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b);
    a = advance_one_lane(ab) ^ static_cast<std::uint32_t>(c);
  }
  for (; n >= 8; p += 8, n -= 8) {
    a = _mm_crc32_u64(a, load_u64(p));
  }
  auto s = static_cast<std::uint32_t>(a);
  for (; n > 0; ++p, --n) {
    s = _mm_crc32_u8(s, *p);
  }
  return s;
}

// Asked once, on first use rather than at static initialisation: another translation unit's
// static initialiser may checksum something before this one's would have run.
bool cpu_has_sse42() noexcept {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}

#endif  // TIERFLOW_CRC32C_X86

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
#if TIERFLOW_CRC32C_X86
  if (cpu_has_sse42()) {
    return ~hardware(p, bytes, ~crc);
  }
#endif
  return ~software(p, bytes, ~crc);
}

std::uint32_t crc32c_software(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  return ~software(static_cast<const unsigned char*>(data), bytes, ~crc);
}

bool crc32c_hardware_available() noexcept {
#if TIERFLOW_CRC32C_X86
  return cpu_has_sse42();
#else
  return false;
#endif
}

}  // namespace tierflow::detail
