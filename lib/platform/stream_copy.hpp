#pragma once
// Copies that bypass the cache (non-temporal stores) for large blocks: the destination is not
// read for ownership, so a copy writes each byte once. Owns the ISA #if.

#include <cstddef>

namespace tierflow::detail::platform {

/** memcpy semantics (no overlap); non-temporal stores from 256 KiB up where the CPU has them. */
void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept;

}  // namespace tierflow::detail::platform
