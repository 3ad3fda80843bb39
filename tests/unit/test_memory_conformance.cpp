// One conformance suite run against every memory resource and adaptor chain.

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/limit_resource.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/pool_resource.hpp"
#include "tierflow/statistics_resource.hpp"

using namespace tierflow;

namespace {

numa_resource_options node0(bool populate = false) {
  numa_resource_options o;
  o.nodes = {numa_node_id{0}};
  o.populate = populate;
  return o;
}

// Each fixture builds one resource chain; `leak_free()` says whether everything went back.
struct numa_chain {
  numa_resource numa{node0()};
  statistics_resource stats{numa};
  memory_resource& get() { return stats; }
  bool leak_free() const { return stats.bytes().current == 0; }
};
struct numa_populated_chain {
  numa_resource numa{node0(true)};
  statistics_resource stats{numa};
  memory_resource& get() { return stats; }
  bool leak_free() const { return stats.bytes().current == 0; }
};
struct weighted_chain {
  numa_resource numa{[] {
    auto o = node0(true);
    o.policy = numa_policy::weighted_interleave;
    o.weights = {3};
    return o;
  }()};
  statistics_resource stats{numa};
  memory_resource& get() { return stats; }
  bool leak_free() const { return stats.bytes().current == 0; }
};
struct pool_chain {
  numa_resource numa{node0()};
  statistics_resource upstream{numa};
  pool_resource pool{upstream, pool_options{std::size_t{8} << 20, 0}};
  memory_resource& get() { return pool; }
  bool leak_free() const { return pool.allocated_bytes() == 0; }
};
struct pinned_chain {
  numa_resource numa{node0()};
  statistics_resource upstream{numa};
  pinned_resource pinned{upstream};
  memory_resource& get() { return pinned; }
  bool leak_free() const {
    return pinned.pinned_bytes().current == 0 && upstream.bytes().current == 0;
  }
};
struct pinned_pool_chain {
  numa_resource numa{node0()};
  pinned_resource pinned{numa};
  pool_resource pool{pinned, pool_options{std::size_t{8} << 20, 0}};
  memory_resource& get() { return pool; }
  bool leak_free() const { return pool.allocated_bytes() == 0; }
};
struct limit_chain {
  numa_resource numa{node0()};
  limit_resource limit{numa, std::uint64_t{1} << 30, "test tier"};
  memory_resource& get() { return limit; }
  bool leak_free() const { return limit.used_bytes() == 0; }
};

std::uint8_t pattern_byte(std::uint64_t seed, std::size_t i) {
  return static_cast<std::uint8_t>((seed * 0x9e3779b97f4a7c15ULL + i * 0x5851f42d) >> 56 | 1);
}

void fill(void* p, std::size_t bytes, std::uint64_t seed) {
  auto* b = static_cast<std::uint8_t*>(p);
  for (std::size_t i = 0; i < bytes; ++i) {
    b[i] = pattern_byte(seed, i);
  }
}

bool holds(const void* p, std::size_t bytes, std::uint64_t seed) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (b[i] != pattern_byte(seed, i)) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEMPLATE_TEST_CASE("memory resource conformance", "[memory][conformance]", numa_chain,
                   numa_populated_chain, weighted_chain, pool_chain, pinned_chain,
                   pinned_pool_chain, limit_chain) {
  TestType chain;
  auto& resource = chain.get();
  auto gen = test::rng(100);

  SECTION("alignment is honoured and contents are kept") {
    struct live {
      void* p;
      std::size_t bytes;
      std::size_t alignment;
      std::uint64_t seed;
    };
    std::vector<live> blocks;
    for (int i = 0; i < 40; ++i) {
      const std::size_t alignment = std::size_t{1}
                                    << std::uniform_int_distribution<int>(0, 21)(gen);
      const std::size_t bytes = std::uniform_int_distribution<std::size_t>(1, 3 << 20)(gen);
      void* p = resource.allocate(bytes, alignment);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
      const auto seed = gen();
      fill(p, bytes, seed);
      blocks.push_back({p, bytes, alignment, seed});
    }
    // All still intact once every block is live: no two overlap.
    for (const auto& b : blocks) {
      CHECK(holds(b.p, b.bytes, b.seed));
    }
    std::shuffle(blocks.begin(), blocks.end(), gen);
    for (const auto& b : blocks) {
      resource.deallocate(b.p, b.bytes, b.alignment);
    }
    CHECK(chain.leak_free());
  }

  SECTION("zero size") {
    CHECK(resource.allocate(0) == nullptr);
    resource.deallocate(nullptr, 0);
    CHECK(chain.leak_free());
  }

  SECTION("absurd sizes fail cleanly and leave it usable") {
    for (std::size_t bytes : {std::size_t{1} << 60, SIZE_MAX, SIZE_MAX - 4095}) {
      INFO("bytes " << bytes);
      CHECK_THROWS_AS(resource.allocate(bytes), std::bad_alloc);
      CHECK(chain.leak_free());
    }
    void* p = resource.allocate(4096);
    fill(p, 4096, 7);
    CHECK(holds(p, 4096, 7));
    resource.deallocate(p, 4096);
    CHECK(chain.leak_free());
  }

  SECTION("a bad alignment is an error") {
    CHECK_THROWS_AS(resource.allocate(64, 3), error);
    CHECK_THROWS_AS(resource.allocate(64, std::size_t{1} << 31), error);
    CHECK(chain.leak_free());
  }

  SECTION("two threads allocate and free at once") {
    std::atomic<int> corrupt{0};
    auto worker = [&](std::uint64_t thread_seed) {
      std::mt19937_64 local(thread_seed);
      std::vector<std::pair<void*, std::size_t>> held;
      for (int round = 0; round < 300; ++round) {
        if (held.size() < 8 && (local() % 3 != 0 || held.empty())) {
          const auto bytes = std::uniform_int_distribution<std::size_t>(1, 256 << 10)(local);
          void* p = resource.allocate(bytes);
          fill(p, bytes, thread_seed ^ reinterpret_cast<std::uintptr_t>(p));
          held.emplace_back(p, bytes);
        } else {
          const auto i = local() % held.size();
          auto [p, bytes] = held[i];
          if (!holds(p, bytes, thread_seed ^ reinterpret_cast<std::uintptr_t>(p))) {
            corrupt++;
          }
          resource.deallocate(p, bytes);
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      for (auto [p, bytes] : held) {
        resource.deallocate(p, bytes);
      }
    };
    std::thread a(worker, gen());
    std::thread b(worker, gen());
    a.join();
    b.join();
    CHECK(corrupt.load() == 0);
    CHECK(chain.leak_free());
  }
}
