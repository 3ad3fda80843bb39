// Behaviour of each adaptor and of numa_resource beyond the conformance suite.

#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/limit_resource.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/pool_resource.hpp"
#include "tierflow/statistics_resource.hpp"
#include "tierflow/where.hpp"

using namespace tierflow;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

numa_resource_options on_node0(bool populate = false) {
  numa_resource_options o;
  o.nodes = {numa_node_id{0}};
  o.populate = populate;
  return o;
}

// A fake upstream that fails on request: for rollback tests.
class failing_resource final : public memory_resource {
 public:
  explicit failing_resource(memory_resource& upstream) : upstream_(upstream) {}
  bool fail = false;
  [[nodiscard]] std::string name() const override { return "failing"; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    if (fail) {
      throw error("injected failure");
    }
    return upstream_.allocate(bytes, alignment);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    upstream_.deallocate(p, bytes, alignment);
  }
  memory_resource& upstream_;
};

class failing_locker final : public page_locker {
 public:
  void lock(void*, std::size_t) override { throw error("lock refused (test)"); }
  void unlock(void*, std::size_t) noexcept override {}
  [[nodiscard]] std::string_view name() const noexcept override { return "failing"; }
};

std::uint64_t locked_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmLck:") {
      std::uint64_t kib = 0;
      in >> kib;
      return kib;
    }
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

}  // namespace

TEST_CASE("statistics counts current, peak and total", "[memory][adaptor]") {
  numa_resource numa(on_node0());
  statistics_resource stats(numa);
  auto gen = test::rng(200);
  std::vector<std::pair<void*, std::size_t>> held;
  std::uint64_t total = 0, current = 0, peak = 0;
  for (int i = 0; i < 20; ++i) {
    const auto bytes = std::uniform_int_distribution<std::size_t>(1, mib)(gen);
    held.emplace_back(stats.allocate(bytes), bytes);
    total += bytes;
    current += bytes;
    peak = std::max(peak, current);
    if (i % 3 == 2) {
      stats.deallocate(held.front().first, held.front().second);
      current -= held.front().second;
      held.erase(held.begin());
    }
  }
  CHECK(stats.bytes().current == current);
  CHECK(stats.bytes().peak == peak);
  CHECK(stats.bytes().total == total);
  CHECK(stats.allocations().current == held.size());
  CHECK(stats.allocations().total == 20);
  for (auto [p, b] : held) {
    stats.deallocate(p, b);
  }
  CHECK(stats.bytes().current == 0);
}

TEST_CASE("limit caps, reports and rolls back", "[memory][adaptor]") {
  numa_resource numa(on_node0());
  failing_resource flaky(numa);
  limit_resource limit(flaky, 10 * mib, "small tier");

  void* a = limit.allocate(6 * mib);
  SECTION("too big for what is left") {
    try {
      (void)limit.allocate(5 * mib);
      FAIL("no error");
    } catch (const out_of_capacity& e) {
      CHECK(e.context() == "small tier");
      CHECK(e.requested_bytes() == 5 * mib);
      REQUIRE(e.tiers().size() == 1);
      CHECK(e.tiers()[0].free_bytes == 4 * mib);
      CHECK_THAT(e.what(), Catch::Contains("small tier: 5.0 MiB asked; free: small tier 4.0 MiB"));
    }
    CHECK(limit.used_bytes() == 6 * mib);
  }
  SECTION("fits again after a free") {
    limit.deallocate(a, 6 * mib);
    a = limit.allocate(10 * mib);
    CHECK(limit.available_bytes() == 0);
  }
  SECTION("an upstream failure gives the reservation back") {
    flaky.fail = true;
    CHECK_THROWS_WITH(limit.allocate(mib), Catch::Contains("injected failure"));
    CHECK(limit.used_bytes() == 6 * mib);
    flaky.fail = false;
  }
  limit.deallocate(a, limit.used_bytes());
  CHECK(limit.used_bytes() == 0);
}

TEST_CASE("pool reuses, coalesces and does not round to powers of two", "[memory][adaptor]") {
  numa_resource numa(on_node0());
  statistics_resource upstream(numa);
  pool_resource pool(upstream, pool_options{16 * mib, 0});

  SECTION("a freed block is reused without growing") {
    void* a = pool.allocate(mib);
    pool.deallocate(a, mib);
    void* b = pool.allocate(mib);
    CHECK(b == a);
    CHECK(upstream.allocations().total == 1);
    pool.deallocate(b, mib);
  }
  SECTION("freed neighbours coalesce") {
    const std::size_t small = 256 << 10;  // below the dedicated size: shares a chunk
    void* a = pool.allocate(small);
    void* b = pool.allocate(small);
    void* c = pool.allocate(small);
    pool.deallocate(a, small);
    pool.deallocate(b, small);
    void* d = pool.allocate(2 * small);  // fits where a and b were only once they merged
    CHECK(d == a);
    CHECK(upstream.allocations().total == 1);
    pool.deallocate(c, small);
    pool.deallocate(d, 2 * small);
  }
  SECTION("a large request gets an exact chunk; small ones share") {
    void* big = pool.allocate(5 * mib + 1);  // above 16 MiB / 20
    CHECK(pool.upstream_bytes() == 5 * mib + 4096);
    void* small = pool.allocate(100 << 10);
    CHECK(pool.upstream_bytes() == 5 * mib + 4096 + 16 * mib);
    void* small2 = pool.allocate(100 << 10);
    CHECK(upstream.allocations().total == 2);
    pool.deallocate(big, 5 * mib + 1);
    pool.deallocate(small, 100 << 10);
    pool.deallocate(small2, 100 << 10);
  }
  SECTION("held memory stays within 1.05 x in use + one chunk for random sizes") {
    auto gen = test::rng(202);
    std::vector<std::pair<void*, std::size_t>> held;
    std::uint64_t in_use = 0;
    while (in_use < 256 * mib) {
      const auto bytes = std::uniform_int_distribution<std::size_t>(1, 24 * mib)(gen);
      held.emplace_back(pool.allocate(bytes), bytes);
      in_use += bytes;
    }
    INFO("held " << pool.upstream_bytes() << " for " << in_use);
    CHECK(static_cast<double>(pool.upstream_bytes()) <=
          1.05 * static_cast<double>(in_use) + 16.0 * mib);
    for (auto [p, b] : held) {
      pool.deallocate(p, b);
    }
  }
  SECTION("a large request gets a chunk of its own size") {
    const std::size_t bytes = 100 * mib + 12345;
    void* p = pool.allocate(bytes);
    const auto held = pool.upstream_bytes();
    CHECK(held >= bytes);
    CHECK(held <= bytes + 4096);  // page rounding only, not 128 MiB
    pool.deallocate(p, bytes);
    pool.release_unused();
    CHECK(pool.upstream_bytes() == 0);
    CHECK(upstream.bytes().current == 0);
  }
  SECTION("max_bytes caps the pool") {
    pool_resource capped(upstream, pool_options{4 * mib, 8 * mib});
    void* a = capped.allocate(4 * mib);
    void* b = capped.allocate(4 * mib);
    CHECK_THROWS_AS(capped.allocate(mib), out_of_capacity);
    capped.deallocate(a, 4 * mib);
    void* c = capped.allocate(mib);  // fits in a's chunk
    CHECK(capped.upstream_bytes() == 8 * mib);
    capped.deallocate(b, 4 * mib);
    capped.deallocate(c, mib);
  }
  SECTION("reserve takes chunks up front from several threads") {
    pool.reserve(64 * mib, 2);
    CHECK(pool.upstream_bytes() == 64 * mib);
    const auto chunks = upstream.allocations().total;
    std::vector<void*> blocks;
    for (int i = 0; i < 4; ++i) {
      blocks.push_back(pool.allocate(15 * mib));
    }
    CHECK(upstream.allocations().total == chunks);  // served from the reserve
    for (void* p : blocks) {
      pool.deallocate(p, 15 * mib);
    }
  }
  SECTION("an unknown pointer is logged, not freed") {
    test::captured_log log;
    int on_stack = 0;
    pool.deallocate(&on_stack, 8);
    CHECK(pool.allocated_bytes() == 0);
    CHECK_THAT(log.text(), Catch::Contains("deallocate of a pointer it did not hand out"));
  }
}

TEST_CASE("pool memory comes back when the pool goes", "[memory][adaptor]") {
  numa_resource numa(on_node0());
  statistics_resource upstream(numa);
  test::captured_log log;
  {
    pool_resource pool(upstream, pool_options{4 * mib, 0});
    (void)pool.allocate(mib);  // left allocated on purpose
    (void)pool.allocate(6 * mib);
    CHECK(upstream.bytes().current > 0);
  }
  CHECK(upstream.bytes().current == 0);
  CHECK_THAT(log.text(), Catch::Contains("destroyed with 2 allocation(s) still in use"));
}

TEST_CASE("pinned memory is really locked, and a failed lock frees it", "[memory][adaptor]") {
  numa_resource numa(on_node0());
  statistics_resource upstream(numa);
  {
    pinned_resource pinned(upstream);
    const auto before = locked_kib();
    const std::size_t bytes = 8 * mib + 100;
    void* p = pinned.allocate(bytes);
    if (test::under_sanitizer) {  // the sanitizer runtimes make mlock a no-op
      WARN("mlock is a no-op under sanitizers: VmLck not checked in this build");
    } else {
      CHECK(locked_kib() >= before + bytes / 1024);
    }
    CHECK(pinned.pinned_bytes().current == 8 * mib + 4096);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
    pinned.deallocate(p, bytes);
    CHECK(locked_kib() <= before);
    CHECK(pinned.pinned_bytes().current == 0);
  }
  failing_locker refuse;
  pinned_resource broken(upstream, refuse);
  CHECK_THROWS_WITH(broken.allocate(mib), Catch::Contains("lock refused"));
  CHECK(upstream.bytes().current == 0);
  CHECK(broken.name() == "pinned(failing, statistics(numa(bind 0)))");
}

TEST_CASE("numa_resource places pages on node 0 and where() sees them", "[memory][numa]") {
  auto gen = test::rng(201);
  const std::size_t bytes = std::uniform_int_distribution<std::size_t>(8 * mib, 48 * mib)(gen);
  SECTION("populated at allocate") {
    numa_resource numa(on_node0(true));
    void* p = numa.allocate(bytes);
    const auto r = where(p, bytes);
    CHECK(r.total_pages == (bytes + r.page_bytes - 1) / r.page_bytes);
    CHECK(r.pages_on(0) == r.total_pages);
    CHECK(r.untouched_pages == 0);
    numa.deallocate(p, bytes);
  }
  SECTION("untouched until written") {
    numa_resource numa(on_node0(false));
    auto* p = static_cast<char*>(numa.allocate(bytes));
    auto r = where(p, bytes);
    CHECK(r.untouched_pages == r.total_pages);
    std::memset(p, 0x5a, bytes / 2);
    r = where(p, bytes);
    CHECK(r.pages_on(0) >= bytes / 2 / r.page_bytes);
    CHECK(r.pages_on(0) + r.untouched_pages == r.total_pages);
    numa.deallocate(p, bytes);
  }
}

TEST_CASE("weighted interleave uses the kernel when weights match, else a split",
          "[memory][numa]") {
  const auto kernel_weight_path = "/sys/kernel/mm/mempolicy/weighted_interleave/node0";
  std::ifstream in(kernel_weight_path);
  unsigned kernel_weight = 0;
  const bool kernel_has_weights = static_cast<bool>(in >> kernel_weight);
  auto options = on_node0(true);
  options.policy = numa_policy::weighted_interleave;
  {
    numa_resource by_kernel(options);  // no weights: the kernel's
    void* p = by_kernel.allocate(4 * mib);
    CHECK(where(p, 4 * mib).pages_on(0) == 4 * mib / 4096);
    if (kernel_has_weights) {
      CHECK(by_kernel.effective_policy() == "weighted_interleave (kernel)");
    } else {
      CHECK(by_kernel.effective_policy() == "weighted_interleave (user-space split)");
    }
    by_kernel.deallocate(p, 4 * mib);
  }
  options.weights = {kernel_weight + 1};  // not the kernel's: honoured by a split
  numa_resource split(options);
  void* p = split.allocate(4 * mib);
  CHECK(split.effective_policy() == "weighted_interleave (user-space split)");
  CHECK(where(p, 4 * mib).pages_on(0) == 4 * mib / 4096);
  split.deallocate(p, 4 * mib);
}

TEST_CASE("numa_resource rejects bad options", "[memory][numa]") {
  numa_resource_options o;
  CHECK_THROWS_WITH(numa_resource(o), Catch::Contains("at least one node"));
  o.nodes = {numa_node_id{0}, numa_node_id{0}};
  CHECK_THROWS_WITH(numa_resource(o), Catch::Contains("listed twice"));
  o.nodes = {numa_node_id{-1}};
  CHECK_THROWS_WITH(numa_resource(o), Catch::Contains("out of range"));
  o.nodes = {numa_node_id{0}};
  o.policy = numa_policy::weighted_interleave;
  o.weights = {0};
  CHECK_THROWS_WITH(numa_resource(o), Catch::Contains("weight 0"));
  o.weights = {1, 2};
  CHECK_THROWS_WITH(numa_resource(o), Catch::Contains("2 weights for 1 nodes"));
  o.policy = numa_policy::bind;
  o.weights = {1};
  CHECK_THROWS_WITH(numa_resource(o), Catch::Contains("only for weighted_interleave"));
  // A node this machine does not have fails at allocate, naming the mbind.
  o.weights.clear();
  o.nodes = {numa_node_id{1000}};
  numa_resource missing(o);
  CHECK_THROWS_WITH(missing.allocate(mib), Catch::Contains("mbind"));
}
