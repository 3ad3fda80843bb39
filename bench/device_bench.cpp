// tierflow-device-bench: the device layer's performance targets, each beside its bound.
//   enqueue          cost of enqueueing one operation on a stream     target: <= 5 us (emulated)
//   h2d_pinned, d2h_pinned   copies from registered NUMA memory, vs the link (emulated: its
//                    cap; cuda: cudaMemcpyAsync from cudaMallocHost, target >= 0.95x)
//   h2d_pageable     copies from pageable memory through the staging engine
// GB/s = 10^9 bytes per second.

#include <cstring>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/bench_util.hpp"
#include "cuda_reference.hpp"
#include "tierflow/device.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/transfer_engine.hpp"

using namespace tierflow;
using namespace tierflow::bench;
using json = nlohmann::ordered_json;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

// Host memory bandwidth for copies of @p bytes, split over two threads as the emulated device
// splits them.
double host_memcpy_gbps(std::size_t bytes, int samples) {
  std::vector<unsigned char> a(bytes, 1), b(bytes, 2);
  std::vector<double> gbps;
  for (int i = -1; i < samples; ++i) {
    const auto start = clock_type::now();
    std::thread helper([&] { std::memcpy(b.data(), a.data(), bytes / 2); });
    std::memcpy(b.data() + bytes / 2, a.data() + bytes / 2, bytes - bytes / 2);
    helper.join();
    if (i >= 0) {
      gbps.push_back(static_cast<double>(bytes) / seconds_since(start) / 1e9);
    }
  }
  keep(b[bytes / 3]);
  return summarize(gbps).median;
}

json bench_enqueue(device& dev, int samples) {
  constexpr int operations = 20000;
  auto& s = dev.compute_stream();
  auto e = dev.create_event();
  std::vector<double> callback_us, record_us;
  for (int i = 0; i < samples; ++i) {
    auto start = clock_type::now();
    for (int op = 0; op < operations; ++op) {
      s.host_callback([] {});
    }
    callback_us.push_back(seconds_since(start) / operations * 1e6);
    s.synchronize();
    start = clock_type::now();
    for (int op = 0; op < operations; ++op) {
      s.record(*e);
    }
    record_us.push_back(seconds_since(start) / operations * 1e6);
    s.synchronize();
  }
  const auto cb = summarize(callback_us);
  return json{{"case", "enqueue"},
              {"unit", "us per operation"},
              {"host_callback", summary_json(cb)},
              {"event_record", summary_json(summarize(record_us))},
              {"target_us", 5.0},
              {"pass", cb.median <= 5.0}};
}

json bench_copy(device& dev, transfer_engine& engine, copy_kind kind, bool pinned,
                std::size_t bytes, int samples, double memcpy_gbps) {
  numa_resource_options host_options;
  host_options.nodes = {numa_node_id{0}};
  host_options.populate = true;
  numa_resource host_memory(host_options);
  pinned_resource registered(host_memory, dev.host_registration());
  memory_resource& source = pinned ? static_cast<memory_resource&>(registered) : host_memory;
  auto* host = static_cast<unsigned char*>(source.allocate(bytes));
  void* device_buffer = dev.memory().allocate(bytes);
  std::memset(host, 0x5a, bytes);
  const auto host_space = pinned ? memory_space::host_pinned : memory_space::host;
  if (kind == copy_kind::d2h) {  // the device holds the pattern; the host gets it back
    engine.copy(device_buffer, memory_space::device, host, host_space, bytes)->synchronize();
    std::memset(host, 0, bytes);
  }
  std::vector<double> gbps;
  for (int i = -1; i < samples; ++i) {  // one warm-up
    const auto start = clock_type::now();
    if (kind == copy_kind::h2d) {
      engine.copy(device_buffer, memory_space::device, host, host_space, bytes)->synchronize();
    } else {
      engine.copy(host, host_space, device_buffer, memory_space::device, bytes)->synchronize();
    }
    if (i >= 0) {
      gbps.push_back(static_cast<double>(bytes) / seconds_since(start) / 1e9);
    }
  }
  bool verified = true;
  if (kind == copy_kind::d2h) {
    for (std::size_t k = 0; k < bytes; k += 4096) {
      verified = verified && host[k] == 0x5a;
    }
  }
  dev.memory().deallocate(device_buffer, bytes);
  source.deallocate(host, bytes);
  const auto s = summarize(gbps);
  const auto& p = dev.properties();
  std::optional<double> bound = kind == copy_kind::h2d ? p.h2d_gbps : p.d2h_gbps;
  std::string bound_is = "link model cap";
  if (p.backend == "emulated" && memcpy_gbps < *bound) {
    // The emulated link moves real bytes: below its cap, host memory bandwidth is the bound.
    bound = memcpy_gbps;
    bound_is = "host memcpy, 2 threads";
  }
  if (p.backend == "cuda" && pinned) {
    bound = cuda_reference_gbps(kind == copy_kind::h2d, bytes, samples);
    bound_is = "cudaMemcpyAsync from cudaMallocHost";
  }
  json out{{"case", std::string(to_string(kind)) + (pinned ? "_pinned" : "_pageable")},
           {"unit", "GB/s"},
           {"bytes", bytes},
           {"achieved", summary_json(s)},
           {"verified", verified}};
  if (bound) {
    out["bound_gbps"] = *bound;
    out["bound_is"] = bound_is;
    out["ratio"] = s.median / *bound;
    if (p.backend == "cuda" && pinned) {
      out["target_ratio"] = 0.95;
      out["pass"] = s.median >= 0.95 * *bound;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierflow-device-bench: device layer benchmarks (GB/s = 10^9 B/s)"};
  std::string backend = "emulated";
  int samples = 7;
  std::size_t copy_mib = 256;
  app.add_option("--device", backend, "auto, emulated, cuda or cuda:N");
  app.add_option("--samples", samples, "Samples per case")->check(CLI::Range(1, 1000));
  app.add_option("--copy-mib", copy_mib, "Bytes per copy, MiB")->check(CLI::Range(1, 1 << 16));
  CLI11_PARSE(app, argc, argv);
  try {
    auto dev = open_device(backend);
    transfer_engine engine(*dev);
    json results = json::array();
    results.push_back(bench_enqueue(*dev, samples));
    const auto bytes = copy_mib * mib;
    const double memcpy_gbps = host_memcpy_gbps(bytes, samples);
    results.push_back(bench_copy(*dev, engine, copy_kind::h2d, true, bytes, samples, memcpy_gbps));
    results.push_back(bench_copy(*dev, engine, copy_kind::d2h, true, bytes, samples, memcpy_gbps));
    results.push_back(bench_copy(*dev, engine, copy_kind::h2d, false, bytes, samples, memcpy_gbps));
    const json doc{{"benchmark", "tierflow-device-bench"},
                   {"device", dev->properties().name},
                   {"backend", dev->properties().backend},
                   {"results", results}};
    std::cout << doc.dump(2) << '\n';
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierflow-device-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
