// The node cases of `tierflow bench`: bandwidth of each STREAM kernel and dependent-load
// latency, from each initiator node's CPUs to memory on each node.

#include <algorithm>
#include <cstdint>
#include <random>

#include "bench/case_registry.hpp"
#include "bench/stream_kernels.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;

// Input patterns whose results are exact in double: small integers, and s = 3.
constexpr double triad_scalar = 3.0;
constexpr double write_value = 1.5;
double pattern_a(std::size_t i) {
  return static_cast<double>(i % 16);
}
double pattern_b(std::size_t i) {
  return static_cast<double>(i % 7 + 1);
}
double pattern_c(std::size_t i) {
  return static_cast<double>(i % 5 + 2);
}

// Whether the arrays hold what @p op leaves, checked at a stride of 4093 elements and at the
// ends; for read, whether @p sum is the exact sum of pattern_a.
bool verify_op(stream_op op, const double* a, const double* b, std::size_t n, double sum) {
  if (op == stream_op::read) {
    const std::size_t full = n / 16;
    double expected = static_cast<double>(full) * 120.0;  // 0 + 1 + ... + 15 per 16
    for (std::size_t i = full * 16; i < n; ++i) {
      expected += pattern_a(i);
    }
    return sum == expected;
  }
  for (std::size_t i = 0; i < n; i = i + 4093 < n || i == n - 1 ? i + 4093 : n - 1) {
    bool ok = true;
    switch (op) {
      case stream_op::write:
      case stream_op::write_nt:
        ok = a[i] == write_value;
        break;
      case stream_op::copy:
        ok = b[i] == pattern_a(i);
        break;
      case stream_op::triad:
        ok = a[i] == pattern_b(i) + triad_scalar * pattern_c(i);
        break;
      case stream_op::read:
        break;
    }
    if (!ok) {
      return false;
    }
  }
  return true;
}

// The bandwidth cases' arrays on the target node and the team of the current thread count.
struct node_arrays final : site_fixture {
  std::vector<std::unique_ptr<node_buffer>> buffers;
  std::size_t n = 0;
  double* a = nullptr;
  double* b = nullptr;
  double* c = nullptr;
  std::unique_ptr<pinned_team> team;
};

// Writes fresh inputs, first touched by the initiator's threads.
void fill_inputs(node_arrays& arrays, unsigned threads) {
  arrays.team->run([&](unsigned t) {
    const auto [begin, end] = part(arrays.n, t, threads);
    for (std::size_t i = begin; i < end; ++i) {
      arrays.a[i] = pattern_a(i);
      if (arrays.b != nullptr) {
        arrays.b[i] = pattern_b(i);
      }
      if (arrays.c != nullptr) {
        arrays.c[i] = pattern_c(i);
      }
    }
  });
}

void measure_stream(run_context& ctx, node_arrays& arrays, const bench_site& site, stream_op op) {
  const std::string name(case_name(op));
  const unsigned threads = site.threads;
  const std::size_t n = arrays.n;
  double *a = arrays.a, *b = arrays.b, *c = arrays.c;
  fill_inputs(arrays, threads);
  std::vector<double> sums(threads);
  const auto values = sample(ctx.config.samples, [&] {
    const double seconds = arrays.team->run([&](unsigned t) {
      const auto [begin, end] = part(n, t, threads);
      const double scalar = op == stream_op::triad ? triad_scalar : write_value;
      sums[t] = run_stream_op(op, a + begin, b ? b + begin : nullptr, c ? c + begin : nullptr,
                              end - begin, scalar);
    });
    return bytes_per_element(op) * static_cast<double>(n) / seconds / 1e9;
  });
  double sum = 0;
  for (const double s : sums) {
    sum += s;
  }
  json tc = testcase(name, "node_bandwidth", "GB/s", values);
  tc["bytes"] = static_cast<std::uint64_t>(bytes_per_element(op) * static_cast<double>(n));
  tc["array_bytes"] = n * sizeof(double);
  tc["threads"] = threads;
  tc["initiator"] = site.from.id.value;
  tc["target"] = site.to.id.value;
  tc["isa"] = std::string(stream_isa());
  tc["huge_page_fraction"] = arrays.buffers[0]->huge_page_fraction();
  tc["verified"] = verify_op(op, a, b, n, sum);
  const auto hmat = ctx.topo.access(site.from.id, site.to.id);
  const auto& firmware = op == stream_op::read ? hmat.read_bandwidth : hmat.write_bandwidth;
  if (firmware.known() && op != stream_op::copy && op != stream_op::triad) {
    tc["hmat"] = firmware.value / 1000.0;  // MB/s -> GB/s
    tc["hmat_source"] = std::string(to_string(firmware.source));
  }
  ctx.testcases.push_back(std::move(tc));
  ctx.step(name + " " + std::to_string(site.from.id.value) + "->" +
           std::to_string(site.to.id.value) + " x" + std::to_string(threads));
}

registered_case stream_case(stream_op op, const char* what) {
  return {{std::string(case_name(op)), "node_bandwidth", what},
          case_need::cpu_node,
          [](const bench_config& config, const numa_node& from) {
            return thread_counts(config, from.cpus.size()).size();
          },
          [op](run_context& ctx, site_fixture& fixture, const bench_site& site) {
            measure_stream(ctx, static_cast<node_arrays&>(fixture), site, op);
          }};
}

// Every thread count, then every selected op: the arrays are allocated once per node pair.
void run_bandwidth_site(run_context& ctx, const numa_node& from, const numa_node& to,
                        const std::vector<const registered_case*>& selected) {
  if (!fits(to, 3 * ctx.array_bytes)) {
    for (const auto* c : selected) {
      ctx.testcases.push_back(waived(c->info.name, short_of_memory(to, 3, ctx.array_bytes),
                                     from.id.value, to.id.value));
    }
    return;
  }
  int count = 0;
  for (const auto* c : selected) {
    for (const auto op : {stream_op::read, stream_op::write, stream_op::write_nt, stream_op::copy,
                          stream_op::triad}) {
      count = c->info.name == case_name(op) ? std::max(count, arrays_of(op)) : count;
    }
  }
  node_arrays arrays;
  arrays.n = ctx.array_bytes / sizeof(double) / 16 * 16;
  for (int k = 0; k < count; ++k) {
    arrays.buffers.push_back(std::make_unique<node_buffer>(to.id.value, arrays.n * sizeof(double),
                                                           ctx.config.huge_pages));
  }
  arrays.a = arrays.buffers[0]->as<double>();
  arrays.b = count > 1 ? arrays.buffers[1]->as<double>() : nullptr;
  arrays.c = count > 2 ? arrays.buffers[2]->as<double>() : nullptr;
  for (const unsigned threads : thread_counts(ctx.config, from.cpus.size())) {
    arrays.team = std::make_unique<pinned_team>(from.cpus, threads);
    for (const auto* c : selected) {
      c->run(ctx, arrays, {from, to, threads});
    }
  }
}

// A random cyclic order of @p lines cache lines (Sattolo: one cycle through every line),
// written as pointers by one thread of @p team.
void write_random_cycle(pinned_team& team, unsigned char* base, std::size_t lines) {
  constexpr std::size_t line = 64;
  std::vector<std::size_t> order(lines);
  for (std::size_t i = 0; i < lines; ++i) {
    order[i] = i;
  }
  std::mt19937_64 gen(std::random_device{}());
  for (std::size_t i = lines - 1; i > 0; --i) {
    std::uniform_int_distribution<std::size_t> pick(0, i - 1);
    std::swap(order[i], order[pick(gen)]);
  }
  team.run([&](unsigned) {
    for (std::size_t i = 0; i < lines; ++i) {
      *reinterpret_cast<void**>(base + order[i] * line) = base + order[(i + 1) % lines] * line;
    }
  });
}

// Whether the cycle is whole: following it `lines` times from the start comes back to it.
bool cycle_is_whole(unsigned char* base, std::size_t lines) {
  void* p = base;
  std::size_t steps = 0;
  do {
    p = *static_cast<void**>(p);
    ++steps;
  } while (p != base && steps <= lines);
  return steps == lines;
}

// A dependent pointer chase over one random cycle through every cache line of the buffer.
void measure_latency(run_context& ctx, const bench_site& site) {
  constexpr std::size_t line = 64;
  const std::size_t lines = ctx.latency_bytes / line;
  node_buffer buffer(site.to.id.value, lines * line, ctx.config.huge_pages);
  auto* base = buffer.as<unsigned char>();
  pinned_team team(site.from.cpus, 1);
  write_random_cycle(team, base, lines);
  const std::uint64_t loads = std::max<std::uint64_t>(ctx.config.latency_loads, 1024);
  void* position = base;
  const auto values = sample(ctx.config.samples, [&] {
    const double seconds = team.run([&](unsigned) {
      void* p = position;
      for (std::uint64_t k = 0; k < loads; ++k) {
        p = *static_cast<void**>(p);
      }
      position = p;
    });
    return seconds / static_cast<double>(loads) * 1e9;
  });
  json tc = testcase("node_latency", "node_latency", "ns", values);
  tc["bytes"] = lines * line;
  tc["threads"] = 1;
  tc["initiator"] = site.from.id.value;
  tc["target"] = site.to.id.value;
  tc["loads"] = loads;
  tc["huge_pages"] = ctx.config.huge_pages;
  tc["huge_page_fraction"] = buffer.huge_page_fraction();
  tc["verified"] = cycle_is_whole(base, lines);
  const auto hmat = ctx.topo.access(site.from.id, site.to.id).read_latency;
  if (hmat.known()) {
    tc["hmat"] = hmat.value;
    tc["hmat_source"] = std::string(to_string(hmat.source));
  }
  ctx.testcases.push_back(std::move(tc));
  ctx.step("node_latency " + std::to_string(site.from.id.value) + "->" +
           std::to_string(site.to.id.value));
}

void run_latency_site(run_context& ctx, const numa_node& from, const numa_node& to,
                      const std::vector<const registered_case*>& selected) {
  if (!fits(to, ctx.latency_bytes)) {
    for (const auto* c : selected) {
      ctx.testcases.push_back(waived(c->info.name, short_of_memory(to, 1, ctx.latency_bytes),
                                     from.id.value, to.id.value));
    }
    return;
  }
  site_fixture none;
  for (const auto* c : selected) {
    c->run(ctx, none, {from, to, 1});
  }
}

}  // namespace

case_group node_bandwidth_group() {
  return {case_site::every_pair,
          {stream_case(stream_op::read, "read (sum) bandwidth, initiator x target, 1..N threads"),
           stream_case(stream_op::write, "write (store) bandwidth, initiator x target"),
           stream_case(stream_op::write_nt, "non-temporal write bandwidth, initiator x target"),
           stream_case(stream_op::copy, "copy b = a bandwidth (read + write bytes)"),
           stream_case(stream_op::triad, "triad a = b + s*c bandwidth (three streams)")},
          run_bandwidth_site};
}

case_group node_latency_group() {
  return {case_site::every_pair,
          {{{"node_latency", "node_latency", "dependent-load latency over a random cycle, ns"},
            case_need::cpu_node,
            [](const bench_config&, const numa_node&) { return std::size_t{1}; },
            [](run_context& ctx, site_fixture&, const bench_site& site) {
              measure_latency(ctx, site);
            }}},
          run_latency_site};
}

}  // namespace tierflow::cli
