// tierflow-gpu-adam-bench: Adam on a device, each figure next to its bound from the same run.
//   link      H2D and D2H of one buffer of page-locked (host_registration) host memory
//   d2d       a device-to-device copy: the HBM copy bandwidth (read + write bytes counted)
//   kernel    the device Adam update (make_device_adam: adam_cuda.cu on CUDA, its CPU twin on
//             the emulated device) over device-resident f32 state, 32 B/param (read master,
//             m, v, grad; write master, m, v, param), against d2d
//   streamed  offload_adam.step() in streamed mode: the state lives in a host tier and streams
//             through HBM in chunks; params/s against the link bound, max(H2D bytes / H2D
//             GB/s, D2H bytes / D2H GB/s) per step (a full-duplex link), with the bytes the
//             optimizer itself reports having moved
// Warm-up, then the median of --samples. GB/s = 10^9 bytes per second.
// bench/gpu_check.sh runs it on the cuda backend; --device emulated exercises every case
// without a GPU.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/bench_util.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/device_adam.hpp"
#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;
using namespace tierflow::bench;
using json = nlohmann::ordered_json;

namespace {

constexpr double kernel_bytes_per_param = 32.0;

// Device memory, freed on scope exit.
struct device_array {
  device& dev;
  std::size_t bytes;
  void* ptr;
  device_array(device& d, std::size_t b) : dev(d), bytes(b), ptr(d.memory().allocate(b)) {}
  ~device_array() { dev.memory().deallocate(ptr, bytes); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  [[nodiscard]] float* f() const { return static_cast<float*>(ptr); }
};

// Seconds of @p work on @p on, between two events.
template <typename F>
double timed_on(device& dev, stream& on, F&& work) {
  auto start = dev.create_event();
  auto end = dev.create_event();
  on.record(*start);
  work();
  on.record(*end);
  end->synchronize();
  return event::elapsed_ms(*start, *end) / 1e3;
}

void upload(device& dev, void* dst, const std::vector<float>& src) {
  dev.copy_async(dst, src.data(), src.size() * sizeof(float), copy_kind::h2d, dev.compute_stream());
  dev.compute_stream().synchronize();
}

json rate(const std::vector<double>& seconds, double units, const char* unit) {
  const summary s = summarize(seconds);
  return {{"seconds", summary_json(s)}, {unit, units / s.median}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierflow-gpu-adam-bench: device Adam and streamed Adam against their bounds"};
  std::string device_spec = "cuda";
  std::string params_text = "256M";
  std::string link_text = "256M";
  int samples = 5;
  std::size_t chunk = std::size_t{1} << 22;
  bool as_json = false;
  app.add_option("--device", device_spec, "cuda, cuda:N, emulated or auto")->capture_default_str();
  app.add_option("--params", params_text, "Parameter count (suffix K, M, G: powers of 2)")
      ->capture_default_str();
  app.add_option("--link-bytes", link_text, "Bytes per link and d2d copy (suffix K, M, G)")
      ->capture_default_str();
  app.add_option("--samples", samples, "Samples per case (after one warm-up)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--chunk", chunk, "Streamed mode: elements per chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--json", as_json, "Print one JSON document");
  CLI11_PARSE(app, argc, argv);
  std::size_t n = 0;
  std::size_t link_bytes = 0;
  try {
    n = parse_count(params_text, "--params");
    link_bytes = parse_count(link_text, "--link-bytes");
  } catch (const std::exception& e) {
    std::cerr << "tierflow-gpu-adam-bench: error: " << e.what() << "\n";
    return 2;
  }

  try {
    auto dev = open_device(device_spec);
    stream& compute = dev->compute_stream();
    json doc{{"device", {{"backend", dev->properties().backend}, {"name", dev->properties().name}}},
             {"params", n},
             {"samples", samples},
             {"units", "GB/s = 10^9 B/s"}};

    // link: page-locked host memory <-> HBM.
    std::vector<double> h2d_s, d2h_s;
    {
      // Page-aligned, as tier memory is.
      const std::size_t host_bytes = (link_bytes + 4095) / 4096 * 4096;
      const std::unique_ptr<std::byte, decltype(&std::free)> host(
          static_cast<std::byte*>(std::aligned_alloc(4096, host_bytes)), &std::free);
      if (!host) {
        throw std::bad_alloc();
      }
      std::memset(host.get(), 0x5a, host_bytes);
      dev->host_registration().lock(host.get(), host_bytes);
      device_array buf(*dev, link_bytes);
      for (int s = -1; s < samples; ++s) {
        const double up = timed_on(*dev, dev->h2d_stream(), [&] {
          dev->copy_async(buf.ptr, host.get(), link_bytes, copy_kind::h2d, dev->h2d_stream());
        });
        const double down = timed_on(*dev, dev->d2h_stream(), [&] {
          dev->copy_async(host.get(), buf.ptr, link_bytes, copy_kind::d2h, dev->d2h_stream());
        });
        if (s >= 0) {
          h2d_s.push_back(up);
          d2h_s.push_back(down);
        }
      }
      dev->host_registration().unlock(host.get(), host_bytes);
    }
    const double h2d_gbps = static_cast<double>(link_bytes) / summarize(h2d_s).median / 1e9;
    const double d2h_gbps = static_cast<double>(link_bytes) / summarize(d2h_s).median / 1e9;
    doc["link"] = {{"bytes", link_bytes}, {"h2d_gbps", h2d_gbps}, {"d2h_gbps", d2h_gbps}};

    // d2d: the HBM copy bandwidth, read + write.
    std::vector<double> d2d_s;
    {
      device_array a(*dev, link_bytes);
      device_array b(*dev, link_bytes);
      for (int s = -1; s < samples; ++s) {
        const double t = timed_on(*dev, compute, [&] {
          dev->copy_async(b.ptr, a.ptr, link_bytes, copy_kind::d2d, compute);
        });
        if (s >= 0) {
          d2d_s.push_back(t);
        }
      }
    }
    const double d2d_gbps = 2.0 * static_cast<double>(link_bytes) / summarize(d2d_s).median / 1e9;
    doc["d2d"] = {{"bytes", link_bytes}, {"gbps_read_write", d2d_gbps}};

    // The state: random, as Adam sees it mid-training (uniform in [-1, 1) from a fresh seed;
    // a normal draw per element would take longer than the benchmark at 256M params).
    std::uint64_t state = std::random_device{}() | 1u;
    const auto uniform = [&state] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0);
    };
    std::vector<float> p(n), g(n), m(n), v(n);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = uniform();
      g[i] = 0.01f * uniform();
      m[i] = 0.001f * uniform();
      v[i] = 1e-6f * std::fabs(uniform()) + 1e-9f;
    }
    adam_hyper hyper;
    hyper.weight_decay = 0.01;
    const std::size_t bytes = n * sizeof(float);

    // kernel: the device update over resident state.
    {
      device_array master(*dev, bytes), dm(*dev, bytes), dv(*dev, bytes), dg(*dev, bytes),
          dp(*dev, bytes);
      upload(*dev, master.ptr, p);
      upload(*dev, dp.ptr, p);
      upload(*dev, dm.ptr, m);
      upload(*dev, dv.ptr, v);
      upload(*dev, dg.ptr, g);
      auto kernel = detail::make_device_adam(*dev, adam_kernel::automatic, 1);
      std::vector<double> kernel_s;
      for (int s = -1; s < samples; ++s) {
        const auto scalars =
            detail::make_adam_scalars(hyper, static_cast<std::uint64_t>(s + 2), 1.0);
        const double t = timed_on(*dev, compute, [&] {
          kernel->update(compute, master.f(), dm.f(), dv.f(), dg.ptr, dp.ptr, param_dtype::f32, n,
                         scalars);
        });
        if (s >= 0) {
          kernel_s.push_back(t);
        }
      }
      json k = rate(kernel_s, static_cast<double>(n), "params_per_s");
      const double gbps =
          kernel_bytes_per_param * static_cast<double>(n) / summarize(kernel_s).median / 1e9;
      k["bytes_per_param"] = kernel_bytes_per_param;
      k["gbps"] = gbps;
      k["bound_gbps"] = d2d_gbps;
      k["ratio"] = gbps / d2d_gbps;
      doc["kernel"] = k;
    }

    // streamed: offload_adam with its state in a host tier, params and grads in HBM.
    {
      device_array dp(*dev, bytes), dg(*dev, bytes);
      upload(*dev, dp.ptr, p);
      upload(*dev, dg.ptr, g);
      const topology topo = topology::discover();
      placement_options po;
      po.reserve_bytes = 0;
      placement_policy placement(topo, po);
      adam_options ao;
      ao.mode = adam_mode::streamed;
      ao.chunk_elements = std::min(n, chunk);
      std::vector<adam_group> groups(1);
      groups[0].hyper = hyper;
      groups[0].params.push_back({"w", dp.ptr, dg.ptr, param_dtype::f32, n});
      offload_adam opt(*dev, groups, ao, placement);
      std::vector<double> step_s;
      std::uint64_t h2d_step = 0;
      std::uint64_t d2h_step = 0;
      for (int s = -1; s < samples; ++s) {
        const auto before = opt.metrics();
        const auto r = opt.step();
        if (!r.applied) {
          throw error("the streamed step was skipped: " + r.skip_reason);
        }
        const auto after = opt.metrics();
        if (s >= 0) {
          step_s.push_back(r.seconds);
          h2d_step = after.bytes_h2d - before.bytes_h2d;
          d2h_step = after.bytes_d2h - before.bytes_d2h;
        }
      }
      const double bound_s = std::max(static_cast<double>(h2d_step) / (h2d_gbps * 1e9),
                                      static_cast<double>(d2h_step) / (d2h_gbps * 1e9));
      json st = rate(step_s, static_cast<double>(n), "params_per_s");
      const double params_per_s = st["params_per_s"].get<double>();
      st["mode"] = std::string(to_string(opt.metrics().mode));
      st["chunk_elements"] = ao.chunk_elements;
      st["bytes_h2d_per_step"] = h2d_step;
      st["bytes_d2h_per_step"] = d2h_step;
      st["link_bound_params_per_s"] = static_cast<double>(n) / bound_s;
      st["ratio"] = params_per_s * bound_s / static_cast<double>(n);
      doc["streamed"] = st;
    }

    if (as_json) {
      std::printf("%s\n", doc.dump().c_str());
      return 0;
    }
    std::printf("tierflow-gpu-adam-bench on %s (%s), %zu params; GB/s = 10^9 B/s\n",
                dev->properties().name.c_str(), dev->properties().backend.c_str(), n);
    std::printf("link      h2d %.2f GB/s  d2h %.2f GB/s (page-locked, %zu MiB)\n", h2d_gbps,
                d2h_gbps, link_bytes >> 20);
    std::printf("d2d       %.1f GB/s (read + write)\n", d2d_gbps);
    std::printf("kernel    %.1f GB/s at 32 B/param = %.3f x d2d, %.3g params/s\n",
                doc["kernel"]["gbps"].get<double>(), doc["kernel"]["ratio"].get<double>(),
                doc["kernel"]["params_per_s"].get<double>());
    std::printf("streamed  %.3g params/s = %.3f x the link bound (%.3g params/s), mode %s\n",
                doc["streamed"]["params_per_s"].get<double>(),
                doc["streamed"]["ratio"].get<double>(),
                doc["streamed"]["link_bound_params_per_s"].get<double>(),
                doc["streamed"]["mode"].get<std::string>().c_str());
    return 0;
  } catch (const input_error& e) {
    std::cerr << "tierflow-gpu-adam-bench: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tierflow-gpu-adam-bench: error: " << e.what() << "\n";
    return 1;
  }
}
