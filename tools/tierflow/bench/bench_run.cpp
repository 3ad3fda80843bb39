#include "bench/bench_run.hpp"

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <sched.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench/stream_kernels.hpp"
#include "common/bench_util.hpp"
#include "tierflow/build_config.hpp"
#include "tierflow/detail/adam_bound.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/transfer_engine.hpp"

namespace tierflow::cli {

using json = nlohmann::ordered_json;
using bench::clock_type;
using bench::seconds_since;
using bench::summarize;
using bench::summary;
using bench::summary_json;

const std::vector<bench_case>& bench_cases() {
  static const std::vector<bench_case> cases = {
      {"node_read", "node_bandwidth", "read (sum) bandwidth, initiator x target, 1..N threads"},
      {"node_write", "node_bandwidth", "write (store) bandwidth, initiator x target"},
      {"node_write_nt", "node_bandwidth", "non-temporal write bandwidth, initiator x target"},
      {"node_copy", "node_bandwidth", "copy b = a bandwidth (read + write bytes)"},
      {"node_triad", "node_bandwidth", "triad a = b + s*c bandwidth (three streams)"},
      {"node_latency", "node_latency", "dependent-load latency over a random cycle, ns"},
      {"h2d_pinned", "link", "host -> device from registered memory on each node"},
      {"d2h_pinned", "link", "device -> host into registered memory on each node"},
      {"h2d_pageable", "link", "host -> device from pageable memory (staged)"},
      {"d2h_pageable", "link", "device -> host into pageable memory (staged)"},
      {"bidir_pinned", "link", "h2d and d2h at once, registered memory, both directions' bytes"},
      {"h2d_pinned_chunks", "link_sweep", "h2d bandwidth vs chunk size (64 KiB .. 64 MiB)"},
      {"d2h_pinned_chunks", "link_sweep", "d2h bandwidth vs chunk size (64 KiB .. 64 MiB)"},
      {"adam_bound", "adam", "Adam-shaped memory bound: 28 B/param, trivial arithmetic"},
      {"adam_cpu", "adam", "tierflow's CPU Adam step (best SIMD kernel), 28 B/param"},
  };
  return cases;
}

bool case_selected(const std::string& name, const std::vector<std::string>& patterns) {
  if (patterns.empty()) {
    return true;
  }
  // A case's own name selects that case alone (h2d_pinned, not h2d_pinned_chunks); anything
  // else selects the cases it begins.
  const auto is_case = [](const std::string& p) {
    return std::any_of(bench_cases().begin(), bench_cases().end(),
                       [&](const bench_case& c) { return c.name == p; });
  };
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
    return name == p || (!is_case(p) && name.rfind(p, 0) == 0);
  });
}

std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  for (int index = 0; index < 16; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(in >> text) || text.empty()) {
      break;
    }
    std::size_t value = 0;
    std::size_t pos = 0;
    try {
      value = std::stoull(text, &pos);
    } catch (const std::exception&) {
      continue;
    }
    const std::string unit = text.substr(pos);
    value *= unit == "K" ? 1024 : unit == "M" ? 1024 * 1024 : 1;
    best = std::max(best, value);
  }
  return best ? best : std::size_t{32} << 20;
}

namespace {

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = kib * kib;

// Threads pinned one per CPU (round robin over @p cpus) that run one job together; run()
// times the job from their common start to the last one's end.
class pinned_team {
 public:
  pinned_team(const std::vector<int>& cpus, unsigned count)
      : start_(count + 1), end_(count + 1), begins_(count), ends_(count) {
    try {
      start(cpus, count);
    } catch (...) {  // e.g. EAGAIN: the threads that started leave, then the error goes on
      for (auto k = threads_.size(); k < count; ++k) {
        start_.arrive_and_drop();  // the missing ones no longer count
        end_.arrive_and_drop();
      }
      stop_ = true;
      start_.arrive_and_wait();
      for (auto& th : threads_) {
        th.join();
      }
      throw;
    }
  }
  ~pinned_team() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& th : threads_) {
      th.join();
    }
  }
  pinned_team(const pinned_team&) = delete;
  pinned_team& operator=(const pinned_team&) = delete;

  [[nodiscard]] unsigned size() const { return static_cast<unsigned>(threads_.size()); }

  // Seconds from the first thread's start to the last thread's end: each thread reads the
  // clock itself (the caller may be descheduled while the team runs, on a busy machine).
  double run(std::function<void(unsigned)> job) {
    job_ = std::move(job);
    start_.arrive_and_wait();
    end_.arrive_and_wait();
    const auto first = *std::min_element(begins_.begin(), begins_.end());
    const auto last = *std::max_element(ends_.begin(), ends_.end());
    return std::chrono::duration<double>(last - first).count();
  }

 private:
  void start(const std::vector<int>& cpus, unsigned count) {
    for (unsigned t = 0; t < count; ++t) {
      const int cpu = cpus[t % cpus.size()];
      threads_.emplace_back([this, t, cpu] {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        ::sched_setaffinity(0, sizeof set, &set);  // best effort: a cgroup may forbid it
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) {
            return;
          }
          begins_[t] = clock_type::now();
          job_(t);
          ends_[t] = clock_type::now();
          end_.arrive_and_wait();
        }
      });
    }
  }

  std::barrier<> start_;
  std::barrier<> end_;
  std::function<void(unsigned)> job_;
  bool stop_ = false;                           // written before the start barrier, read after it
  std::vector<clock_type::time_point> begins_;  // per thread, read after the end barrier
  std::vector<clock_type::time_point> ends_;
  std::vector<std::thread> threads_;
};

// [begin, end) of thread @p t's part of @p n elements, in multiples of 16.
std::pair<std::size_t, std::size_t> part(std::size_t n, unsigned t, unsigned threads) {
  const std::size_t blocks = n / 16;
  const std::size_t begin = blocks * t / threads * 16;
  const std::size_t end = blocks * (t + 1) / threads * 16;
  return {begin, end};
}

// One measurement's samples, taken after one warm-up.
template <typename F>
std::vector<double> sample(int samples, F&& once) {
  std::vector<double> values;
  for (int s = -1; s < samples; ++s) {
    const double v = once();
    if (s >= 0) {
      values.push_back(v);
    }
  }
  return values;
}

json testcase(const std::string& name, const std::string& group, const char* unit,
              const std::vector<double>& values) {
  json tc{{"name", name}, {"group", group}, {"status", "ok"}, {"unit", unit}};
  tc.update(summary_json(summarize(values)));
  return tc;
}

// A case this machine cannot run here, in its group, with where it would have run.
json waived(const std::string& name, const std::string& reason, int initiator = -1,
            int target = -1) {
  std::string group;
  for (const auto& c : bench_cases()) {
    if (c.name == name) {
      group = c.group;
    }
  }
  json w{{"name", name}, {"group", group}, {"status", "waived"}, {"reason", reason}};
  if (initiator >= 0) {
    w["initiator"] = initiator;
  }
  if (target >= 0) {
    w["target"] = target;
  }
  return w;
}

// Whether @p need bytes fit in the free memory of @p node, keeping 64 MiB for everyone else.
bool fits(const numa_node& node, std::size_t need) {
  return !node.free_bytes || *node.free_bytes > need + (std::size_t{64} << 20);
}

// A mapping of @p bytes bound to @p node, freed on destruction. With @p huge, transparent huge
// pages are asked for; without, they are refused (MADV_NOHUGEPAGE), as most programs' memory
// is when THP is in `madvise` mode.
class node_buffer {
 public:
  node_buffer(int node, std::size_t bytes, bool huge)
      : resource_(options(node, huge)), bytes_(bytes) {
    data_ = resource_.allocate(bytes, 64);
    if (!huge) {
      ::madvise(data_, bytes_, MADV_NOHUGEPAGE);  // advisory, as huge pages are
    }
  }
  ~node_buffer() { resource_.deallocate(data_, bytes_, 64); }
  node_buffer(const node_buffer&) = delete;
  node_buffer& operator=(const node_buffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  /// The share of the buffer backed by huge pages now (/proc/self/smaps AnonHugePages of the
  /// mappings it spans); -1 when smaps cannot be read.
  [[nodiscard]] double huge_page_fraction() const {
    std::ifstream in("/proc/self/smaps");
    if (!in) {
      return -1;
    }
    const auto begin = reinterpret_cast<std::uintptr_t>(data_);
    const auto end = begin + bytes_;
    std::string line;
    double share = 0;  // of the current mapping that overlaps the buffer
    double huge_bytes = 0;
    while (std::getline(in, line)) {
      unsigned long lo = 0, hi = 0;
      char dash = 0;
      std::istringstream head(line);
      if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
        // A mapping header line ("lo-hi perms ..."). Neighbouring buffers may share one
        // mapping: count its huge pages in proportion to the overlap.
        const auto overlap =
            std::min<std::uintptr_t>(hi, end) - std::max<std::uintptr_t>(lo, begin);
        share = lo < end && hi > begin && hi > lo
                    ? static_cast<double>(overlap) / static_cast<double>(hi - lo)
                    : 0.0;
        continue;
      }
      if (share > 0 && line.rfind("AnonHugePages:", 0) == 0) {
        huge_bytes += share * 1024.0 * static_cast<double>(std::stoull(line.substr(14)));
      }
    }
    return std::min(1.0, huge_bytes / static_cast<double>(bytes_));
  }

 private:
  static numa_resource_options options(int node, bool huge) {
    numa_resource_options o;
    o.nodes = {numa_node_id{node}};
    o.huge_pages = huge;
    return o;
  }
  numa_resource resource_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

// What a run knows while it measures.
struct context {
  const bench_config& config;
  const topology& topo;
  const bench_progress& progress;
  std::size_t done = 0;
  std::size_t planned = 0;
  json testcases = json::array();
  json device = nullptr;                    // what the link cases ran on
  std::unique_ptr<tierflow::device> dev{};  // opened before anything is measured
  std::string no_device{};                  // why there is none
  void step(const std::string& label) {
    ++done;
    if (progress) {
      progress(done, planned, label);
    }
  }
};

std::vector<unsigned> thread_counts(const bench_config& config, std::size_t cpus) {
  std::vector<unsigned> counts;
  if (!config.threads.empty()) {
    for (const unsigned t : config.threads) {
      counts.push_back(t);
    }
    return counts;
  }
  for (unsigned t = 1; t < cpus; t *= 2) {
    counts.push_back(t);
  }
  counts.push_back(static_cast<unsigned>(cpus));
  return counts;
}

std::vector<const numa_node*> initiators(const topology& topo) {
  std::vector<const numa_node*> out;
  for (const auto& n : topo.nodes()) {
    if (n.has_cpu && !n.cpus.empty()) {
      out.push_back(&n);
    }
  }
  return out;
}

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

void run_node_bandwidth(context& ctx, const numa_node& from, const numa_node& to,
                        std::size_t bytes) {
  const std::vector<stream_op> ops = {stream_op::read, stream_op::write, stream_op::write_nt,
                                      stream_op::copy, stream_op::triad};
  int arrays = 0;
  for (const auto op : ops) {
    if (case_selected(std::string(case_name(op)), ctx.config.cases)) {
      arrays = std::max(arrays, arrays_of(op));
    }
  }
  if (arrays == 0) {
    return;
  }
  const std::size_t n = bytes / sizeof(double) / 16 * 16;
  std::vector<std::unique_ptr<node_buffer>> buffers;
  for (int k = 0; k < arrays; ++k) {
    buffers.push_back(
        std::make_unique<node_buffer>(to.id.value, n * sizeof(double), ctx.config.huge_pages));
  }
  double* a = buffers[0]->as<double>();
  double* b = arrays > 1 ? buffers[1]->as<double>() : nullptr;
  double* c = arrays > 2 ? buffers[2]->as<double>() : nullptr;
  const auto hmat = ctx.topo.access(from.id, to.id);
  for (const unsigned threads : thread_counts(ctx.config, from.cpus.size())) {
    pinned_team team(from.cpus, threads);
    for (const auto op : ops) {
      const std::string name(case_name(op));
      if (!case_selected(name, ctx.config.cases)) {
        continue;
      }
      team.run([&](unsigned t) {  // fresh inputs, first touched by the initiator's threads
        const auto [begin, end] = part(n, t, threads);
        for (std::size_t i = begin; i < end; ++i) {
          a[i] = pattern_a(i);
          if (b != nullptr) {
            b[i] = pattern_b(i);
          }
          if (c != nullptr) {
            c[i] = pattern_c(i);
          }
        }
      });
      std::vector<double> sums(threads);
      const auto values = sample(ctx.config.samples, [&] {
        const double seconds = team.run([&](unsigned t) {
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
      tc["initiator"] = from.id.value;
      tc["target"] = to.id.value;
      tc["isa"] = std::string(stream_isa());
      tc["huge_page_fraction"] = buffers[0]->huge_page_fraction();
      tc["verified"] = verify_op(op, a, b, n, sum);
      const auto& firmware = op == stream_op::read ? hmat.read_bandwidth : hmat.write_bandwidth;
      if (firmware.known() && op != stream_op::copy && op != stream_op::triad) {
        tc["hmat"] = firmware.value / 1000.0;  // MB/s -> GB/s
        tc["hmat_source"] = std::string(to_string(firmware.source));
      }
      ctx.testcases.push_back(std::move(tc));
      ctx.step(name + " " + std::to_string(from.id.value) + "->" + std::to_string(to.id.value) +
               " x" + std::to_string(threads));
    }
  }
}

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const auto open = line.find('[');
  const auto close = line.find(']');
  return open != std::string::npos && close > open ? line.substr(open + 1, close - open - 1)
                                                   : "unavailable";
}

// A dependent pointer chase over one random cycle through every cache line of the buffer.
void run_latency(context& ctx, const numa_node& from, const numa_node& to, std::size_t bytes) {
  constexpr std::size_t line = 64;
  const std::size_t lines = bytes / line;
  node_buffer buffer(to.id.value, lines * line, ctx.config.huge_pages);
  auto* base = buffer.as<unsigned char>();
  std::vector<std::size_t> order(lines);
  for (std::size_t i = 0; i < lines; ++i) {
    order[i] = i;
  }
  std::mt19937_64 gen(std::random_device{}());
  for (std::size_t i = lines - 1; i > 0; --i) {  // Sattolo: one cycle through every line
    std::uniform_int_distribution<std::size_t> pick(0, i - 1);
    std::swap(order[i], order[pick(gen)]);
  }
  pinned_team team(from.cpus, 1);
  team.run([&](unsigned) {
    for (std::size_t i = 0; i < lines; ++i) {
      *reinterpret_cast<void**>(base + static_cast<std::size_t>(order[i]) * line) =
          base + static_cast<std::size_t>(order[(i + 1) % lines]) * line;
    }
  });
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
  // The cycle is whole: following it `lines` times from the start comes back to the start.
  void* p = base;
  std::size_t steps = 0;
  do {
    p = *static_cast<void**>(p);
    ++steps;
  } while (p != base && steps <= lines);
  json tc = testcase("node_latency", "node_latency", "ns", values);
  tc["bytes"] = lines * line;
  tc["threads"] = 1;
  tc["initiator"] = from.id.value;
  tc["target"] = to.id.value;
  tc["loads"] = loads;
  tc["huge_pages"] = ctx.config.huge_pages;
  tc["huge_page_fraction"] = buffer.huge_page_fraction();
  tc["verified"] = steps == lines;
  const auto hmat = ctx.topo.access(from.id, to.id).read_latency;
  if (hmat.known()) {
    tc["hmat"] = hmat.value;
    tc["hmat_source"] = std::string(to_string(hmat.source));
  }
  ctx.testcases.push_back(std::move(tc));
  ctx.step("node_latency " + std::to_string(from.id.value) + "->" + std::to_string(to.id.value));
}

// Host <-> device cases from memory on one host node.
// Bytes from a memory resource, given back on scope exit (a case that throws leaks nothing).
class held_bytes {
 public:
  held_bytes(memory_resource& from, std::size_t bytes)
      : from_(from), bytes_(bytes), data_(static_cast<unsigned char*>(from.allocate(bytes))) {}
  ~held_bytes() { from_.deallocate(data_, bytes_); }
  held_bytes(const held_bytes&) = delete;
  held_bytes& operator=(const held_bytes&) = delete;
  [[nodiscard]] unsigned char* get() const { return data_; }

 private:
  memory_resource& from_;
  std::size_t bytes_;
  unsigned char* data_;
};

class link_bench {
 public:
  link_bench(device& dev, int node, std::size_t bytes)
      : dev_(dev),
        engine_(dev),
        node_(node),
        bytes_(bytes),
        host_memory_(options(node)),
        registered_(host_memory_, dev.host_registration()) {}

  json copy(const std::string& name, copy_kind kind, bool pinned, int samples) {
    memory_resource& source = pinned ? static_cast<memory_resource&>(registered_) : host_memory_;
    const auto space = pinned ? memory_space::host_pinned : memory_space::host;
    const held_bytes host_bytes(source, bytes_);
    const held_bytes device_bytes(dev_.memory(), bytes_);
    unsigned char* host = host_bytes.get();
    unsigned char* device_buffer = device_bytes.get();
    fill(host, kind == copy_kind::h2d ? 0x3c : 0);
    if (kind == copy_kind::d2h) {  // the device holds the pattern
      std::vector<unsigned char> pattern(bytes_);
      fill(pattern.data(), 0x3c);
      engine_.copy(device_buffer, memory_space::device, pattern.data(), memory_space::host, bytes_)
          ->synchronize();
    }
    const auto values = sample(samples, [&] {
      const auto start = clock_type::now();
      if (kind == copy_kind::h2d) {
        engine_.copy(device_buffer, memory_space::device, host, space, bytes_)->synchronize();
      } else {
        engine_.copy(host, space, device_buffer, memory_space::device, bytes_)->synchronize();
      }
      return static_cast<double>(bytes_) / seconds_since(start) / 1e9;
    });
    const bool verified =
        kind == copy_kind::h2d ? device_holds(device_buffer, 0x3c) : matches(host, 0x3c);
    json tc = describe(testcase(name, "link", "GB/s", values), pinned);
    tc["verified"] = verified;
    return tc;
  }

  // H2D and D2H at once on the two copy streams; GB/s counts both directions' bytes.
  json bidirectional(int samples) {
    const held_bytes up_bytes(registered_, bytes_), down_bytes(registered_, bytes_);
    const held_bytes in_bytes(dev_.memory(), bytes_), out_bytes(dev_.memory(), bytes_);
    unsigned char* up = up_bytes.get();
    unsigned char* down = down_bytes.get();
    unsigned char* dev_in = in_bytes.get();
    unsigned char* dev_out = out_bytes.get();
    fill(up, 0x5a);
    engine_.copy(dev_out, memory_space::device, up, memory_space::host_pinned, bytes_)
        ->synchronize();
    fill(up, 0x3c);
    const auto values = sample(samples, [&] {
      const auto start = clock_type::now();
      auto h2d = engine_.copy(dev_in, memory_space::device, up, memory_space::host_pinned, bytes_);
      auto d2h =
          engine_.copy(down, memory_space::host_pinned, dev_out, memory_space::device, bytes_);
      h2d->synchronize();
      d2h->synchronize();
      return 2.0 * static_cast<double>(bytes_) / seconds_since(start) / 1e9;
    });
    const bool verified = matches(down, 0x5a) && device_holds(dev_in, 0x3c);  // both ways
    json tc = describe(testcase("bidir_pinned", "link", "GB/s", values), true);
    tc["bytes"] = 2 * bytes_;
    tc["verified"] = verified;
    return tc;
  }

  // @p bytes_ moved as back-to-back copies of @p chunk on one copy stream.
  json chunks(const std::string& name, copy_kind kind, std::size_t chunk, int samples) {
    const held_bytes host_bytes(registered_, bytes_);
    const held_bytes device_bytes(dev_.memory(), bytes_);
    unsigned char* host = host_bytes.get();
    unsigned char* device_buffer = device_bytes.get();
    fill(host, 0x3c);
    if (kind == copy_kind::d2h) {
      engine_.copy(device_buffer, memory_space::device, host, memory_space::host_pinned, bytes_)
          ->synchronize();
      fill(host, 0);
    }
    stream& s = kind == copy_kind::h2d ? dev_.h2d_stream() : dev_.d2h_stream();
    const auto values = sample(samples, [&] {
      const auto start = clock_type::now();
      for (std::size_t offset = 0; offset < bytes_; offset += chunk) {
        const std::size_t n = std::min(chunk, bytes_ - offset);
        if (kind == copy_kind::h2d) {
          dev_.copy_async(device_buffer + offset, host + offset, n, kind, s);
        } else {
          dev_.copy_async(host + offset, device_buffer + offset, n, kind, s);
        }
      }
      s.synchronize();
      return static_cast<double>(bytes_) / seconds_since(start) / 1e9;
    });
    const bool verified =
        kind == copy_kind::h2d ? device_holds(device_buffer, 0x3c) : matches(host, 0x3c);
    json tc = describe(testcase(name, "link_sweep", "GB/s", values), true);
    tc["chunk_bytes"] = chunk;
    tc["verified"] = verified;
    return tc;
  }

 private:
  static numa_resource_options options(int node) {
    numa_resource_options o;
    o.nodes = {numa_node_id{node}};
    o.populate = true;
    return o;
  }
  // Byte i holds (i * 131 + seed) mod 251: no two neighbouring pages alike.
  void fill(unsigned char* p, unsigned seed) const {
    for (std::size_t i = 0; i < bytes_; ++i) {
      p[i] = seed == 0 ? 0 : static_cast<unsigned char>((i * 131 + seed) % 251);
    }
  }
  // Whether device memory at @p device_buffer holds the pattern (read back into a fresh buffer).
  [[nodiscard]] bool device_holds(unsigned char* device_buffer, unsigned seed) {
    std::vector<unsigned char> back(bytes_);
    engine_.copy(back.data(), memory_space::host, device_buffer, memory_space::device, bytes_)
        ->synchronize();
    return matches(back.data(), seed);
  }
  [[nodiscard]] bool matches(const unsigned char* p, unsigned seed) const {
    for (std::size_t i = 0; i < bytes_; i += 509) {
      if (p[i] != static_cast<unsigned char>((i * 131 + seed) % 251)) {
        return false;
      }
    }
    return p[bytes_ - 1] == static_cast<unsigned char>(((bytes_ - 1) * 131 + seed) % 251);
  }
  json describe(json tc, bool pinned) const {
    tc["bytes"] = bytes_;
    tc["initiator"] = node_;
    tc["pinned"] = pinned;
    tc["backend"] = dev_.properties().backend;
    if (dev_.properties().backend == "emulated") {
      tc["note"] = "emulated device: " + dev_.properties().name;
    }
    return tc;
  }

  device& dev_;
  transfer_engine engine_;
  int node_;
  std::size_t bytes_;
  numa_resource host_memory_;
  pinned_resource registered_;
};

// The chunk sizes of the sweep: the given ones, else 64 KiB x 4^k up to 64 MiB and the copy.
std::vector<std::size_t> sweep_sizes(const bench_config& config) {
  std::vector<std::size_t> sizes = config.chunk_sizes;
  if (sizes.empty()) {
    for (std::size_t c = 64 * kib; c <= 64 * mib && c <= config.link_bytes; c *= 4) {
      sizes.push_back(c);
    }
  }
  return sizes;
}

void run_links(context& ctx) {
  std::vector<std::string> names;
  for (const auto& c : bench_cases()) {
    if ((c.group == "link" || c.group == "link_sweep") && case_selected(c.name, ctx.config.cases)) {
      names.push_back(c.name);
    }
  }
  if (names.empty()) {
    return;
  }
  if (!ctx.dev) {
    for (const auto& name : names) {
      ctx.testcases.push_back(waived(name, "no device: " + ctx.no_device));
    }
    return;
  }
  device& dev = *ctx.dev;
  const auto chunk_sizes = sweep_sizes(ctx.config);
  for (const auto& node : ctx.topo.nodes()) {
    const std::size_t bytes = ctx.config.link_bytes;
    if (!fits(node, 3 * bytes)) {
      for (const auto& name : names) {
        ctx.testcases.push_back(waived(name,
                                       "node " + std::to_string(node.id.value) +
                                           " has too little free memory for 3 x " +
                                           std::to_string(bytes / mib) + " MiB",
                                       node.id.value));
      }
      continue;
    }
    if (ctx.device.is_null()) {
      ctx.device = {{"backend", dev.properties().backend}, {"name", dev.properties().name}};
    }
    // A case that fails here (mlock refused, device memory short) is waived with the reason;
    // the others still run.
    std::unique_ptr<link_bench> lb;
    try {
      lb = std::make_unique<link_bench>(dev, node.id.value, bytes);
    } catch (const std::exception& e) {
      for (const auto& name : names) {
        ctx.testcases.push_back(
            waived(name, std::string("cannot set up: ") + e.what(), node.id.value));
      }
      continue;
    }
    for (const auto& name : names) {
      const std::string where = " node " + std::to_string(node.id.value);
      const auto kind = name.starts_with("h2d") ? copy_kind::h2d : copy_kind::d2h;
      const auto attempt = [&](const std::function<json()>& measure) {
        try {
          ctx.testcases.push_back(measure());
        } catch (const std::exception& e) {
          ctx.testcases.push_back(waived(name, std::string("failed: ") + e.what(), node.id.value));
        }
      };
      if (name == "bidir_pinned") {
        attempt([&] { return lb->bidirectional(ctx.config.samples); });
        ctx.step(name + where);
      } else if (name.ends_with("_chunks")) {
        for (const auto chunk : chunk_sizes) {
          attempt([&] { return lb->chunks(name, kind, chunk, ctx.config.samples); });
          ctx.step(name + where + " " + std::to_string(chunk / kib) + " KiB");
        }
      } else {
        attempt(
            [&] { return lb->copy(name, kind, name.ends_with("_pinned"), ctx.config.samples); });
        ctx.step(name + where);
      }
    }
  }
}

// The Adam cases over state on each node, from the initiator's CPUs.
void run_adam(context& ctx, const numa_node& from, const numa_node& to, std::size_t bytes) {
  const bool bound = case_selected("adam_bound", ctx.config.cases);
  const bool step = case_selected("adam_cpu", ctx.config.cases);
  if (!bound && !step) {
    return;
  }
  const std::size_t n = bytes / sizeof(float) / 64 * 64;
  const bool huge = ctx.config.huge_pages;
  node_buffer bp(to.id.value, n * 4, huge), bg(to.id.value, n * 4, huge),
      bm(to.id.value, n * 4, huge), bv(to.id.value, n * 4, huge);
  float* p = bp.as<float>();
  float* g = bg.as<float>();
  float* m = bm.as<float>();
  float* v = bv.as<float>();
  const unsigned threads = static_cast<unsigned>(from.cpus.size());
  pinned_team team(from.cpus, threads);
  team.run([&](unsigned t) {
    const auto [begin, end] = part(n, t, threads);
    for (std::size_t i = begin; i < end; ++i) {
      p[i] = 0.5f + static_cast<float>(i % 97) * 0.01f;
      g[i] = 0.001f * static_cast<float>(i % 13) - 0.006f;
      m[i] = 0.0001f * static_cast<float>(i % 7);
      v[i] = 1e-6f * static_cast<float>(i % 11 + 1);
    }
  });
  const adam_kernel kernel = detail::resolve_kernel(adam_kernel::automatic);
  adam_hyper hyper;
  hyper.weight_decay = 0.01;
  const auto scalars = detail::make_adam_scalars(hyper, 10, 1.0);
  // Element n/3 after one kernel call, by the scalar reference, to verify the kernel.
  const std::size_t probe = n / 3;
  const auto add = [&](const char* name, const std::vector<double>& seconds, bool verified) {
    std::vector<double> gbps;
    for (const double s : seconds) {
      gbps.push_back(28.0 * static_cast<double>(n) / s / 1e9);
    }
    json tc = testcase(name, "adam", "GB/s", gbps);
    tc["mparams_per_s"] = summarize(gbps).median * 1e9 / 28.0 / 1e6;
    tc["params"] = n;
    tc["bytes"] = 28 * n;
    tc["threads"] = threads;
    tc["initiator"] = from.id.value;
    tc["target"] = to.id.value;
    tc["kernel"] = std::string(to_string(kernel));
    tc["verified"] = verified;
    ctx.testcases.push_back(std::move(tc));
    ctx.step(std::string(name) + " node " + std::to_string(to.id.value));
  };
  if (bound) {
    const float g0 = g[probe], m0 = m[probe];
    int runs = 0;
    const auto seconds = sample(ctx.config.samples, [&] {
      ++runs;
      return team.run([&](unsigned t) {
        const auto [begin, end] = part(n, t, threads);
        detail::adam_bound_pass(kernel, p + begin, m + begin, v + begin, g + begin, end - begin);
      });
    });
    float expect = m0;
    for (int r = 0; r < runs; ++r) {
      expect += g0;
    }
    add("adam_bound", seconds, m[probe] == expect);
  }
  if (step) {
    bool verified = true;
    float rp = p[probe], rm = m[probe], rv = v[probe];
    const float rg = g[probe];
    const auto seconds = sample(ctx.config.samples, [&] {
      const double s = team.run([&](unsigned t) {
        const auto [begin, end] = part(n, t, threads);
        detail::adam_update(kernel, p + begin, m + begin, v + begin, g + begin, param_dtype::f32,
                            end - begin, scalars);
      });
      detail::adam_reference(rp, rm, rv, rg, scalars);
      verified = verified && p[probe] == rp && m[probe] == rm && v[probe] == rv;
      return s;
    });
    add("adam_cpu", seconds, verified);
  }
}

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  }
  return "";
}

json machine_json(const topology& topo, std::size_t llc) {
  utsname u{};
  ::uname(&u);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  json nodes = json::array();
  for (const auto& n : topo.nodes()) {
    std::string tier_name;
    for (const auto& t : topo.tiers()) {
      if (std::find(t.nodes.begin(), t.nodes.end(), n.id) != t.nodes.end()) {
        tier_name = t.name;
      }
    }
    nodes.push_back({{"id", n.id.value},
                     {"has_cpu", n.has_cpu},
                     {"cpus", n.cpus.size()},
                     {"capacity_bytes", n.capacity_bytes},
                     {"kind", std::string(to_string(n.kind))},
                     {"tier", tier_name}});
  }
  return json{{"hostname", host},
              {"kernel", u.release},
              {"cpu_model", read_cpu_model()},
              {"cpus", std::thread::hardware_concurrency()},
              {"llc_bytes", llc},
              {"isa", std::string(stream_isa())},
              {"transparent_huge_pages", thp_mode()},
              {"nodes", nodes}};
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

void check_case_patterns(const std::vector<std::string>& patterns) {
  for (const auto& pattern : patterns) {
    const bool any =
        std::any_of(bench_cases().begin(), bench_cases().end(),
                    [&](const bench_case& c) { return case_selected(c.name, {pattern}); });
    if (!any) {
      throw input_error("--case", "no case is named so or starts so (see tierflow bench --list)",
                        pattern);
    }
  }
}

json run_bench(const bench_config& config, const topology& topo, const bench_progress& progress) {
  check_case_patterns(config.cases);
  context ctx{config, topo, progress};
  // The device first: a bad --device spec or TIERFLOW_EMU_LINK is an input error now, not
  // after minutes of node cases.
  const bool links = std::any_of(bench_cases().begin(), bench_cases().end(), [&](const auto& c) {
    return (c.group == "link" || c.group == "link_sweep") && case_selected(c.name, config.cases);
  });
  if (links) {
    try {
      ctx.dev = open_device(config.device);
    } catch (const input_error&) {
      throw;
    } catch (const std::exception& e) {
      ctx.no_device = e.what();
    }
  }
  if (config.samples < 1) {
    throw input_error("--samples", "must be at least 1", std::to_string(config.samples));
  }
  const auto from_nodes = initiators(topo);
  if (from_nodes.empty()) {
    throw error("bench: no NUMA node with CPUs was found");
  }
  const std::size_t llc = config.llc_bytes ? config.llc_bytes : last_level_cache_bytes();
  const std::size_t bytes = config.buffer_bytes ? config.buffer_bytes : 4 * llc;
  const std::size_t latency_bytes = config.buffer_bytes ? config.buffer_bytes : 8 * llc;

  // Count what will be measured, for the progress bar.
  std::size_t bandwidth_ops = 0;
  for (const auto& c : bench_cases()) {
    if (c.group == "node_bandwidth" && case_selected(c.name, config.cases)) {
      ++bandwidth_ops;
    }
  }
  for (const auto* from : from_nodes) {
    ctx.planned +=
        topo.nodes().size() * (bandwidth_ops * thread_counts(config, from->cpus.size()).size() +
                               (case_selected("node_latency", config.cases) ? 1 : 0));
  }
  for (const auto& c : bench_cases()) {
    if (c.group == "link" && case_selected(c.name, config.cases)) {
      ctx.planned += topo.nodes().size();
    } else if (c.group == "link_sweep" && case_selected(c.name, config.cases)) {
      ctx.planned += topo.nodes().size() * sweep_sizes(config).size();
    } else if (c.group == "adam" && case_selected(c.name, config.cases)) {
      ctx.planned += topo.nodes().size();
    }
  }

  for (const unsigned t : config.threads) {
    if (t == 0) {
      throw input_error("--threads", "thread counts must be at least 1", "0");
    }
  }
  for (const auto* from : from_nodes) {
    for (const auto& to : topo.nodes()) {
      if (fits(to, 3 * bytes)) {
        run_node_bandwidth(ctx, *from, to, bytes);
      } else {
        for (const auto& c : bench_cases()) {
          if (c.group == "node_bandwidth" && case_selected(c.name, config.cases)) {
            ctx.testcases.push_back(waived(c.name,
                                           "node " + std::to_string(to.id.value) +
                                               " has too little free memory for 3 x " +
                                               std::to_string(bytes / mib) + " MiB",
                                           from->id.value, to.id.value));
          }
        }
      }
      if (case_selected("node_latency", config.cases)) {
        if (fits(to, latency_bytes)) {
          run_latency(ctx, *from, to, latency_bytes);
        } else {
          ctx.testcases.push_back(waived("node_latency",
                                         "node " + std::to_string(to.id.value) +
                                             " has too little free memory for " +
                                             std::to_string(latency_bytes / mib) + " MiB",
                                         from->id.value, to.id.value));
        }
      }
    }
  }
  run_links(ctx);
  for (const auto& to : topo.nodes()) {
    if (fits(to, 4 * bytes)) {
      run_adam(ctx, *from_nodes.front(), to, bytes);
      continue;
    }
    for (const char* name : {"adam_bound", "adam_cpu"}) {
      if (case_selected(name, config.cases)) {
        ctx.testcases.push_back(waived(name,
                                       "node " + std::to_string(to.id.value) +
                                           " has too little free memory for 4 x " +
                                           std::to_string(bytes / mib) + " MiB",
                                       from_nodes.front()->id.value, to.id.value));
      }
    }
  }

  json machine = machine_json(topo, llc);
  machine["device"] = ctx.device;
  if (from_nodes.size() < 2) {
    machine["note"] = "one NUMA node with CPUs: the matrix has one initiator row";
  }
  json settings{{"samples", config.samples},
                {"warmup", 1},
                {"buffer_bytes", bytes},
                {"latency_buffer_bytes", latency_bytes},
                {"link_bytes", config.link_bytes},
                {"device", config.device},
                {"huge_pages", config.huge_pages},
                {"llc_bytes_from", config.llc_bytes ? "--llc-mib" : "sysfs (cpu0 caches)"}};
  if (bytes < 4 * llc) {
    settings["note"] = "buffers are below 4 x the last-level cache: cache bandwidth is measured";
  }
  return json{
      {"tierflow_version", TIERFLOW_VERSION_STRING},
      {"date", utc_now()},
      {"units", {{"bandwidth", "GB/s (10^9 B/s)"}, {"size", "MiB (2^20 B)"}, {"latency", "ns"}}},
      {"machine", machine},
      {"settings", settings},
      {"testcases", ctx.testcases}};
}

}  // namespace tierflow::cli
