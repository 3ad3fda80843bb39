#include "tierflow/memory_resource.hpp"

#include <bit>

#include "tierflow/error.hpp"

namespace tierflow {

void* memory_resource::allocate(std::size_t bytes, std::size_t alignment) {
  TIERFLOW_EXPECTS(
      std::has_single_bit(alignment) && alignment <= max_alignment,
      name() + ": alignment " + std::to_string(alignment) + " is not a power of two up to 1 GiB");
  if (bytes == 0) {
    return nullptr;
  }
  return do_allocate(bytes, alignment);
}

void memory_resource::deallocate(void* pointer, std::size_t bytes, std::size_t alignment) noexcept {
  if (pointer == nullptr) {
    return;
  }
  do_deallocate(pointer, bytes, alignment);
}

}  // namespace tierflow
