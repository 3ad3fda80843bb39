// The link cases of `tierflow bench`: host <-> device copies from memory on each host node,
// pinned and pageable, both directions at once, and a sweep of chunk sizes.

#include <algorithm>

#include "bench/case_registry.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/transfer_engine.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;
using bench::clock_type;
using bench::seconds_since;

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

// Host memory on one node, plain and registered with the device, and the copies between it
// and the device that the cases time.
class link_bench final : public site_fixture {
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

  [[nodiscard]] int node() const { return node_; }

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

// Runs @p measure into a testcase; a failure (mlock refused, device memory short) waives the
// case with the reason, and the others still run.
void attempt(run_context& ctx, const std::string& name, int node,
             const std::function<json()>& measure) {
  try {
    ctx.testcases.push_back(measure());
  } catch (const std::exception& e) {
    ctx.testcases.push_back(waived(name, std::string("failed: ") + e.what(), node));
  }
}

std::string where(const link_bench& lb) {
  return " node " + std::to_string(lb.node());
}

registered_case copy_case(const char* name, copy_kind kind, bool pinned, const char* what) {
  return {{name, "link", what},
          case_need::device,
          [](const bench_config&, const numa_node&) { return std::size_t{1}; },
          [name = std::string(name), kind, pinned](run_context& ctx, site_fixture& fixture,
                                                   const bench_site&) {
            auto& lb = static_cast<link_bench&>(fixture);
            attempt(ctx, name, lb.node(),
                    [&] { return lb.copy(name, kind, pinned, ctx.config.samples); });
            ctx.step(name + where(lb));
          }};
}

registered_case bidirectional_case() {
  return {
      {"bidir_pinned", "link", "h2d and d2h at once, registered memory, both directions' bytes"},
      case_need::device,
      [](const bench_config&, const numa_node&) { return std::size_t{1}; },
      [](run_context& ctx, site_fixture& fixture, const bench_site&) {
        auto& lb = static_cast<link_bench&>(fixture);
        attempt(ctx, "bidir_pinned", lb.node(),
                [&] { return lb.bidirectional(ctx.config.samples); });
        ctx.step("bidir_pinned" + where(lb));
      }};
}

registered_case sweep_case(const char* name, copy_kind kind, const char* what) {
  return {
      {name, "link_sweep", what},
      case_need::device,
      [](const bench_config& config, const numa_node&) { return sweep_sizes(config).size(); },
      [name = std::string(name), kind](run_context& ctx, site_fixture& fixture, const bench_site&) {
        auto& lb = static_cast<link_bench&>(fixture);
        for (const auto chunk : sweep_sizes(ctx.config)) {
          attempt(ctx, name, lb.node(),
                  [&] { return lb.chunks(name, kind, chunk, ctx.config.samples); });
          ctx.step(name + where(lb) + " " + std::to_string(chunk / kib) + " KiB");
        }
      }};
}

// One link_bench over host memory on node @p to, shared by every selected case.
void run_link_site(run_context& ctx, const numa_node&, const numa_node& to,
                   const std::vector<const registered_case*>& selected) {
  const std::size_t bytes = ctx.config.link_bytes;
  const auto waive_all = [&](const std::string& reason) {
    for (const auto* c : selected) {
      ctx.testcases.push_back(waived(c->info.name, reason, to.id.value));
    }
  };
  if (!fits(to, 3 * bytes)) {
    waive_all(short_of_memory(to, 3, bytes));
    return;
  }
  device& dev = *ctx.dev;
  if (ctx.device.is_null()) {
    ctx.device = {{"backend", dev.properties().backend}, {"name", dev.properties().name}};
  }
  std::unique_ptr<link_bench> lb;
  try {
    lb = std::make_unique<link_bench>(dev, to.id.value, bytes);
  } catch (const std::exception& e) {
    waive_all(std::string("cannot set up: ") + e.what());
    return;
  }
  for (const auto* c : selected) {
    c->run(ctx, *lb, {to, to, 1});
  }
}

}  // namespace

case_group link_group() {
  return {case_site::first_initiator,
          {copy_case("h2d_pinned", copy_kind::h2d, true,
                     "host -> device from registered memory on each node"),
           copy_case("d2h_pinned", copy_kind::d2h, true,
                     "device -> host into registered memory on each node"),
           copy_case("h2d_pageable", copy_kind::h2d, false,
                     "host -> device from pageable memory (staged)"),
           copy_case("d2h_pageable", copy_kind::d2h, false,
                     "device -> host into pageable memory (staged)"),
           bidirectional_case(),
           sweep_case("h2d_pinned_chunks", copy_kind::h2d,
                      "h2d bandwidth vs chunk size (64 KiB .. 64 MiB)"),
           sweep_case("d2h_pinned_chunks", copy_kind::d2h,
                      "d2h bandwidth vs chunk size (64 KiB .. 64 MiB)")},
          run_link_site};
}

}  // namespace tierflow::cli
