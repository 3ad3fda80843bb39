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

// What a probe of a fast link does; a slow one gets less (plan_probe()).
constexpr probe_plan full_plan{std::size_t{64} << 10, std::size_t{8} << 20, 5, 8, true};
// Seconds a direction's probe may take once it is cut down for a slow link.
constexpr double direction_budget_s = 1.0;
constexpr std::size_t min_small = std::size_t{4} << 10;

// The largest power of two <= @p bytes (at least 1).
std::size_t floor_pow2(double bytes) {
  std::size_t p = 1;
  while (static_cast<double>(p) * 2 <= bytes && p < (std::size_t{1} << 62)) {
    p *= 2;
  }
  return p;
}

// One copy of @p bytes each way @p kind, waited for: seconds.
double one_copy(device& dev, copy_kind kind, void* device_copy, std::byte* host,
                std::size_t bytes) {
  stream& s = kind == copy_kind::h2d ? dev.h2d_stream() : dev.d2h_stream();
  const auto start = clock_type::now();
  if (kind == copy_kind::h2d) {
    dev.copy_async(device_copy, host, bytes, kind, s);
  } else {
    dev.copy_async(host, device_copy, bytes, kind, s);
  }
  s.synchronize();
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// The median over batches of one copy's seconds, @p bytes each way @p kind.
double seconds_per_copy(device& dev, copy_kind kind, void* device_copy, std::byte* host,
                        std::size_t bytes, const probe_plan& plan) {
  stream& s = kind == copy_kind::h2d ? dev.h2d_stream() : dev.d2h_stream();
  std::vector<double> samples;
  for (int b = 0; b < plan.batches; ++b) {
    const auto start = clock_type::now();
    for (int i = 0; i < plan.per_batch; ++i) {
      if (kind == copy_kind::h2d) {
        dev.copy_async(device_copy, host, bytes, kind, s);
      } else {
        dev.copy_async(host, device_copy, bytes, kind, s);
      }
    }
    s.synchronize();
    samples.push_back(std::chrono::duration<double>(clock_type::now() - start).count() /
                      plan.per_batch);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

link_fit fit(device& dev, copy_kind kind, void* device_copy, std::byte* host,
             std::uint64_t& bytes_copied) {
  const double pilot_s = one_copy(dev, kind, device_copy, host, probe_pilot_bytes);
  const probe_plan plan = plan_probe(pilot_s);
  bytes_copied += probe_pilot_bytes + plan_bytes(plan);
  if (plan.warm_up) {
    (void)seconds_per_copy(dev, kind, device_copy, host, plan.small, plan);
  }
  const double t_small = seconds_per_copy(dev, kind, device_copy, host, plan.small, plan);
  const double t_large = seconds_per_copy(dev, kind, device_copy, host, plan.large, plan);
  link_fit f;
  const auto small = static_cast<double>(plan.small);
  const auto large = static_cast<double>(plan.large);
  if (t_large > t_small) {
    f.gbps = (large - small) / (t_large - t_small) / 1e9;
    f.latency_s = std::max(0.0, t_small - small / (f.gbps * 1e9));
  } else {  // noise swamped the difference: all of it bandwidth
    f.gbps = large / t_large / 1e9;
  }
  return f;
}

}  // namespace

std::uint64_t plan_bytes(const probe_plan& plan) {
  const std::uint64_t copies =
      static_cast<std::uint64_t>(plan.batches) * static_cast<std::uint64_t>(plan.per_batch);
  return copies * ((plan.warm_up ? 2 : 1) * plan.small + plan.large);
}

probe_plan plan_probe(double pilot_seconds) {
  // The pilot's time per byte overstates the link's (it includes the latency): a plan sized
  // by it takes at most the budget.
  const double seconds_per_byte =
      std::max(pilot_seconds, 0.0) / static_cast<double>(probe_pilot_bytes);
  if (static_cast<double>(plan_bytes(full_plan)) * seconds_per_byte <= direction_budget_s) {
    return full_plan;
  }
  // Fewer copies first, then smaller ones; the pilot was the warm-up.
  probe_plan plan{0, 0, 3, 2, false};
  if (pilot_seconds * 2 * plan.batches * plan.per_batch > direction_budget_s) {
    plan.batches = 1;  // each copy costs about the budget (a long latency): one of each size
    plan.per_batch = 1;
  }
  const double copies = plan.batches * plan.per_batch;
  plan.large = std::clamp(floor_pow2(direction_budget_s / copies / seconds_per_byte),
                          probe_pilot_bytes, full_plan.large);
  plan.small = std::clamp(plan.large / 32, min_small, full_plan.small);
  return plan;
}

link_fits probe_links(device& dev) {
  std::vector<std::byte> host(full_plan.large);
  std::mt19937_64 gen(std::random_device{}());
  for (auto& b : host) {
    b = static_cast<std::byte>(gen());
  }
  device_buffers buf(dev);
  void* device_copy = buf.floats(full_plan.large / sizeof(float));
  link_fits out;
  out.h2d = fit(dev, copy_kind::h2d, device_copy, host.data(), out.probe_bytes);
  out.d2h = fit(dev, copy_kind::d2h, device_copy, host.data(), out.probe_bytes);
  out.full_duplex = dev.properties().full_duplex;
  return out;
}

}  // namespace tierflow::cli::demo
