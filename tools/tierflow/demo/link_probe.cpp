// The link probe (link_probe.hpp).
#include "demo/link_probe.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <random>
#include <vector>

#include "demo/device_buffers.hpp"

namespace tierflow::cli::demo {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::size_t small = std::size_t{64} << 10;
constexpr std::size_t large = std::size_t{8} << 20;

// The median over batches of one copy's seconds, @p bytes each way @p kind.
double seconds_per_copy(device& dev, copy_kind kind, void* device_copy, std::byte* host,
                        std::size_t bytes) {
  constexpr int batches = 5;
  constexpr int per_batch = 8;
  stream& s = kind == copy_kind::h2d ? dev.h2d_stream() : dev.d2h_stream();
  std::vector<double> samples;
  for (int b = 0; b < batches; ++b) {
    const auto start = clock_type::now();
    for (int i = 0; i < per_batch; ++i) {
      if (kind == copy_kind::h2d) {
        dev.copy_async(device_copy, host, bytes, kind, s);
      } else {
        dev.copy_async(host, device_copy, bytes, kind, s);
      }
    }
    s.synchronize();
    samples.push_back(std::chrono::duration<double>(clock_type::now() - start).count() / per_batch);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

link_fit fit(device& dev, copy_kind kind, void* device_copy, std::byte* host) {
  (void)seconds_per_copy(dev, kind, device_copy, host, small);  // warm up
  const double t_small = seconds_per_copy(dev, kind, device_copy, host, small);
  const double t_large = seconds_per_copy(dev, kind, device_copy, host, large);
  link_fit f;
  if (t_large > t_small) {
    f.gbps = static_cast<double>(large - small) / (t_large - t_small) / 1e9;
    f.latency_s = std::max(0.0, t_small - static_cast<double>(small) / (f.gbps * 1e9));
  } else {  // noise swamped the difference: all of it bandwidth
    f.gbps = static_cast<double>(large) / t_large / 1e9;
  }
  return f;
}

}  // namespace

link_fits probe_links(device& dev) {
  std::vector<std::byte> host(large);
  std::mt19937_64 gen(std::random_device{}());
  for (auto& b : host) {
    b = static_cast<std::byte>(gen());
  }
  device_buffers buf(dev);
  void* device_copy = buf.floats(large / sizeof(float));
  link_fits out;
  out.h2d = fit(dev, copy_kind::h2d, device_copy, host.data());
  out.d2h = fit(dev, copy_kind::d2h, device_copy, host.data());
  out.full_duplex = dev.properties().full_duplex;
  return out;
}

}  // namespace tierflow::cli::demo
