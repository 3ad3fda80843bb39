// tierflow-memory-bench: the memory layer's performance targets, each beside its bound
// measured in the same run.
//   pool_1mib        pooled allocate+free of 1 MiB              target: median <= 1 us
//   populate_1gib    first touch of 1 GiB on a node, 2 threads  target: >= 0.8 x memset GB/s
//   pin_per_call / pin_pool_once / pin_pool_reuse               seconds per GiB
//   pin_overhead     host bytes pinned / bytes requested        target: <= 1.05 (+ one chunk)
// GB/s = 10^9 bytes per second.

#include <cstring>
#include <iostream>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/bench_util.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/pool_resource.hpp"

using namespace tierflow;
using namespace tierflow::bench;
using json = nlohmann::ordered_json;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

numa_resource_options on_node(int node, bool populate, unsigned threads = 0) {
  numa_resource_options o;
  o.nodes = {numa_node_id{node}};
  o.populate = populate;
  o.populate_threads = threads;
  return o;
}

// The line a human reads: the figure (median and spread), its bound, their ratio, the target.
json headline(const summary& s, double scale, const char* unit, const char* target, double bound,
              const char* bound_is, bool pass) {
  return json{{"value", s.median * scale},
              {"min", s.min * scale},
              {"max", s.max * scale},
              {"unit", unit},
              {"bound", bound},
              {"bound_is", bound_is},
              {"ratio", bound > 0 ? s.median * scale / bound : 0.0},
              {"target", target},
              {"pass", pass}};
}

void print_table(const json& results) {
  std::printf("%-14s %12s %-22s %10s  %-28s %7s  %-20s %s\n", "case", "median", "[min - max]",
              "bound", "bound is", "ratio", "target", "result");
  for (const auto& r : results) {
    const auto& h = r.at("headline");
    char spread[64];
    std::snprintf(spread, sizeof spread, "[%.3g - %.3g]", h.at("min").get<double>(),
                  h.at("max").get<double>());
    std::printf("%-14s %8.4g %-3s %-22s %10.3g  %-28s %7.3g  %-20s %s\n",
                r.at("case").get<std::string>().c_str(), h.at("value").get<double>(),
                h.at("unit").get<std::string>().c_str(), spread, h.at("bound").get<double>(),
                h.at("bound_is").get<std::string>().c_str(), h.at("ratio").get<double>(),
                h.at("target").get<std::string>().c_str(),
                h.at("target") == "report" ? "-" : (h.at("pass").get<bool>() ? "PASS" : "FAIL"));
  }
}

// 1 MiB allocate+free through a warm pool, per pair; beside it the raw mmap+mbind+munmap.
json bench_pool(int node, int samples) {
  numa_resource numa(on_node(node, false));
  pool_resource pool(numa);
  pool.deallocate(pool.allocate(mib), mib);  // one chunk in the pool
  constexpr int pairs = 20000;
  std::vector<double> pooled;
  std::vector<double> raw;
  for (int s = 0; s < samples; ++s) {
    auto start = clock_type::now();
    for (int i = 0; i < pairs; ++i) {
      void* p = pool.allocate(mib);
      keep(p);
      pool.deallocate(p, mib);
    }
    pooled.push_back(seconds_since(start) / pairs);
    start = clock_type::now();
    for (int i = 0; i < pairs / 20; ++i) {
      void* p = numa.allocate(mib);
      keep(p);
      numa.deallocate(p, mib);
    }
    raw.push_back(seconds_since(start) / (pairs / 20));
  }
  const auto pooled_s = summarize(pooled);
  const auto raw_s = summarize(raw);
  return json{{"case", "pool_1mib"},
              {"unit", "us per allocate+free"},
              {"pooled", summary_json(pooled_s, 1e6)},
              {"unpooled_mmap_mbind", summary_json(raw_s, 1e6)},
              {"target_us", 1.0},
              {"pass", pooled_s.median <= 1e-6},
              {"headline", headline(pooled_s, 1e6, "us", "median <= 1 us", raw_s.median * 1e6,
                                    "unpooled mmap+mbind+munmap", pooled_s.median <= 1e-6)}};
}

double memset_gbps(void* buffer, std::size_t bytes, unsigned threads) {
  const auto start = clock_type::now();
  std::vector<std::thread> pool;
  const std::size_t share = bytes / threads;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      std::memset(static_cast<char*>(buffer) + t * share, static_cast<int>(t + 1), share);
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  return static_cast<double>(share * threads) / seconds_since(start) / 1e9;
}

// Populating 1 GiB (mmap + mbind + first touch with 2 threads) vs memset of faulted memory.
json bench_populate(int node, int samples, std::size_t bytes) {
  numa_resource populate_2(on_node(node, true, 2));
  numa_resource populate_1(on_node(node, true, 1));
  numa_resource plain(on_node(node, true, 2));
  void* faulted = plain.allocate(bytes);  // memset target: pages already there
  // Warm-up: VMs that hot-plug memory as it is used plug it now, not during a sample.
  populate_2.deallocate(populate_2.allocate(bytes), bytes);
  std::vector<double> pop2, pop1, set1, set2;
  for (int s = 0; s < samples; ++s) {
    auto start = clock_type::now();
    void* p = populate_2.allocate(bytes);
    pop2.push_back(static_cast<double>(bytes) / seconds_since(start) / 1e9);
    populate_2.deallocate(p, bytes);
    start = clock_type::now();
    p = populate_1.allocate(bytes);
    pop1.push_back(static_cast<double>(bytes) / seconds_since(start) / 1e9);
    populate_1.deallocate(p, bytes);
    set2.push_back(memset_gbps(faulted, bytes, 2));
    set1.push_back(memset_gbps(faulted, bytes, 1));
  }
  plain.deallocate(faulted, bytes);
  const auto p2 = summarize(pop2);
  const auto m2 = summarize(set2);
  const auto m1 = summarize(set1);
  const double bound = std::max(m1.median, m2.median);
  return json{{"case", "populate_1gib"},
              {"unit", "GB/s"},
              {"bytes", bytes},
              {"populate_2_threads", summary_json(p2)},
              {"populate_1_thread", summary_json(summarize(pop1))},
              {"memset_2_threads", summary_json(m2)},
              {"memset_1_thread", summary_json(m1)},
              {"bound_gbps", bound},
              {"ratio", p2.median / bound},
              {"target_ratio", 0.8},
              {"pass", p2.median >= 0.8 * bound},
              {"headline", headline(p2, 1.0, "GB/s", "ratio >= 0.8", bound,
                                    "memset of faulted memory", p2.median >= 0.8 * bound)}};
}

// Pinning cost: a per-call register (mlock each allocation) vs a pool that locks once.
json bench_pinning(int node, int samples) {
  constexpr std::size_t buffer = 64 * mib;
  constexpr std::size_t total = gib;
  constexpr std::size_t rounds = total / buffer;
  numa_resource numa(on_node(node, false));
  std::vector<double> per_call, pool_once, pool_reuse;
  for (int s = 0; s < samples; ++s) {
    pinned_resource pinned(numa);
    auto start = clock_type::now();
    for (std::size_t i = 0; i < rounds; ++i) {
      void* p = pinned.allocate(buffer);
      keep(p);
      pinned.deallocate(p, buffer);
    }
    per_call.push_back(seconds_since(start) / (static_cast<double>(total) / gib));

    pool_resource pool(pinned, pool_options{buffer, 0});
    start = clock_type::now();
    pool.reserve(total, 2);  // lock once, two threads
    pool_once.push_back(seconds_since(start) / (static_cast<double>(total) / gib));
    start = clock_type::now();
    for (std::size_t i = 0; i < rounds; ++i) {
      void* p = pool.allocate(buffer);
      keep(p);
      pool.deallocate(p, buffer);
    }
    pool_reuse.push_back(seconds_since(start) / (static_cast<double>(total) / gib));
  }
  const auto reuse = summarize(pool_reuse);
  const auto per_call_s = summarize(per_call);
  return json{{"case", "pinning"},
              {"unit", "seconds per GiB"},
              {"pin_per_call", summary_json(per_call_s)},
              {"pin_pool_once", summary_json(summarize(pool_once))},
              {"pin_pool_reuse", summary_json(reuse)},
              {"headline",
               headline(reuse, 1.0, "s/GiB", "report", per_call_s.median, "per-call mlock", true)}};
}

// Host memory pinned for a mix of request sizes held at once, vs the bytes asked.
json bench_pin_overhead(int node, std::uint64_t seed) {
  numa_resource numa(on_node(node, false));
  pinned_resource pinned(numa);
  constexpr std::size_t chunk = 64 * mib;
  pool_resource pool(pinned, pool_options{chunk, 0});
  std::mt19937_64 gen(seed);
  std::vector<std::pair<void*, std::size_t>> held;
  std::uint64_t requested = 0;
  std::uint64_t power_of_two = 0;
  while (requested < 2 * gib) {
    const auto bytes = std::uniform_int_distribution<std::size_t>(4096, 96 * mib)(gen);
    held.emplace_back(pool.allocate(bytes), bytes);
    requested += bytes;
    power_of_two += std::bit_ceil(bytes);
  }
  const auto pinned_bytes = pinned.pinned_bytes().current;
  for (auto [p, b] : held) {
    pool.deallocate(p, b);
  }
  const double ratio = static_cast<double>(pinned_bytes) / static_cast<double>(requested);
  const double bound = 1.05 + static_cast<double>(chunk) / static_cast<double>(requested);
  return json{
      {"case", "pin_overhead"},
      {"seed", seed},
      {"requests", held.size()},
      {"requested_bytes", requested},
      {"pinned_bytes", pinned_bytes},
      {"ratio", ratio},
      {"power_of_two_ratio", static_cast<double>(power_of_two) / static_cast<double>(requested)},
      {"target_ratio", bound},
      {"pass", ratio <= bound},
      {"headline", json{{"value", ratio},
                        {"min", ratio},
                        {"max", ratio},
                        {"unit", "pinned/requested"},
                        {"bound", 1.0},
                        {"bound_is", "bytes requested"},
                        {"ratio", ratio},
                        {"target", "<= " + std::to_string(bound).substr(0, 5) + " (1.05+chunk)"},
                        {"pass", ratio <= bound}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierflow-memory-bench: memory layer benchmarks (GB/s = 10^9 B/s)"};
  int node = 0;
  int samples = 7;
  std::size_t populate_mib = 1024;
  bool json_output = false;
  std::uint64_t seed = std::random_device{}();
  std::vector<std::string> cases;
  app.add_option("--node", node, "NUMA node to allocate on");
  app.add_option("--samples", samples, "Samples per case (median and spread are reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--populate-mib", populate_mib, "Bytes to populate, MiB")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--seed", seed, "Seed for random request sizes");
  app.add_option("--case", cases, "Cases to run (pool, populate, pinning, overhead); default all");
  app.add_flag("--json", json_output, "Print JSON");
  CLI11_PARSE(app, argc, argv);
  auto wanted = [&](const char* name) {
    return cases.empty() || std::find(cases.begin(), cases.end(), name) != cases.end();
  };
  try {
    json results = json::array();
    if (wanted("pool"))
      results.push_back(bench_pool(node, samples));
    if (wanted("populate"))
      results.push_back(bench_populate(node, samples, populate_mib * mib));
    if (wanted("pinning"))
      results.push_back(bench_pinning(node, samples));
    if (wanted("overhead"))
      results.push_back(bench_pin_overhead(node, seed));
    const json doc{{"benchmark", "tierflow-memory-bench"},
                   {"node", node},
                   {"threads_available", std::thread::hardware_concurrency()},
                   {"results", results}};
    if (json_output) {
      std::cout << doc.dump(2) << '\n';
    } else {
      std::printf("tierflow-memory-bench: node %d, %u CPUs, %d samples (GB/s = 10^9 B/s)\n", node,
                  std::thread::hardware_concurrency(), samples);
      print_table(results);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierflow-memory-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
