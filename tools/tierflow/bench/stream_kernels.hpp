#pragma once
// The memory kernels of `tierflow bench`, as STREAM and likwid-bench define them, over arrays
// of double: read (sum), write (store), write_nt (non-temporal store), copy (b = a) and triad
// (a = b + s * c). Each has AVX-512, AVX2 and scalar versions, chosen at run time by CPU
// feature detection. Bytes counted per element: read 8, write 8, copy 16, triad 24
// (write-allocate traffic not counted).

#include <cstddef>
#include <string_view>

namespace tierflow::cli {

enum class stream_op { read, write, write_nt, copy, triad };

/** @brief The case name of @p op (`node_read`, ..., `node_triad`). */
std::string_view case_name(stream_op op) noexcept;

/** @brief Arrays an op touches (1, 2 or 3). */
int arrays_of(stream_op op) noexcept;

/** @brief Bytes moved per element (8 per array touched, as STREAM counts). */
double bytes_per_element(stream_op op) noexcept;

/** @brief The instruction set the kernels use on this CPU: `avx512`, `avx2` or `scalar`. */
std::string_view stream_isa() noexcept;

/**
 * @brief Runs @p op over @p n elements (a multiple of 16; arrays 64-byte aligned).
 * read sums @p a and returns the sum; write and write_nt store @p scalar into @p a; copy writes
 * @p a into @p b; triad writes b + scalar * c into @p a. Returns 0 for the ops that do not sum.
 */
double run_stream_op(stream_op op, double* a, double* b, double* c, std::size_t n,
                     double scalar) noexcept;

}  // namespace tierflow::cli
