#pragma once
// Which PCI devices tierflow treats as GPUs: NVIDIA display or 3D controllers (the backends
// are CUDA). One rule for every source that lists PCI devices (sysfs, hwloc).

namespace tierflow::detail::platform {

/** @p vendor is the PCI vendor id, @p base_class the class code's upper 16 bits (0x0302). */
constexpr bool is_cuda_gpu(unsigned vendor, unsigned base_class) noexcept {
  constexpr unsigned nvidia = 0x10de;
  constexpr unsigned vga_controller = 0x0300;
  constexpr unsigned controller_3d = 0x0302;
  return vendor == nvidia && (base_class == vga_controller || base_class == controller_3d);
}

}  // namespace tierflow::detail::platform
