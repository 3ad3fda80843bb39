// The bad-input table (docs/bad-input.md): the rows no other test backed. Each test gives a
// public entry point invalid input and checks the exception type, that the message names the
// argument (or source) and the offending value, and that nothing changed.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/limit_resource.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/pool_resource.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/schedule_model.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/statistics_resource.hpp"
#include "tierflow/tierflow.h"
#include "tierflow/topology.hpp"
#include "tierflow/transfer_engine.hpp"
#include "tierflow/where.hpp"

using namespace tierflow;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

numa_resource_options on_node0() {
  numa_resource_options o;
  o.nodes = {numa_node_id{0}};
  o.huge_pages = false;
  return o;
}

// Host memory from the C heap that does not care which size it is given back: lets a test
// hand an adaptor a mismatched deallocate without the upstream unmapping the wrong range.
class heap_resource final : public memory_resource {
 public:
  [[nodiscard]] std::string name() const override { return "heap"; }
  int live = 0;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (p == nullptr) {
      throw out_of_capacity("heap", bytes, {});
    }
    ++live;
    return p;
  }
  void do_deallocate(void* p, std::size_t, std::size_t) noexcept override {
    --live;
    std::free(p);
  }
};

std::unique_ptr<emulated_device> small_device() {
  emulated_device_options o;
  o.link = link_model::parse("h2d=40GB/s,d2h=40GB/s,latency=1us", "test");
  o.copy_threads = 1;
  o.hbm_bytes = std::uint64_t{64} << 20;
  return emulated_device::create(o);
}

topology laptop() {
  test::scoped_env no_tiers("TIERFLOW_TIERS", nullptr);
  discovery_options o;
  o.sysfs_root = test::sysfs_fixture("laptop");
  return topology::discover(o);
}

// A random non-power-of-two alignment, at most 1 GiB + a bit.
std::size_t bad_alignment(std::mt19937_64& gen) {
  while (true) {
    const auto a = std::uniform_int_distribution<std::size_t>(3, (std::size_t{1} << 30) + 7)(gen);
    if ((a & (a - 1)) != 0) {
      return a;
    }
  }
}

}  // namespace

// --- memory -------------------------------------------------------------------------------

TEST_CASE("bad input: a bad alignment names the resource and the value, counters stay put",
          "[bad_input][memory]") {
  auto gen = test::rng(0xbad0);
  numa_resource numa(on_node0());
  statistics_resource stats(numa);
  limit_resource limit(stats, 64 * mib, "small tier");
  pool_resource pool(limit, pool_options{8 * mib, 0, 0});
  const auto held_bytes = std::uniform_int_distribution<std::size_t>(1, mib)(gen);
  void* held = pool.allocate(held_bytes);
  const auto bytes_before = stats.bytes();
  const auto used_before = limit.used_bytes();
  const auto pool_before = pool.allocated_bytes();
  for (int i = 0; i < 8; ++i) {
    const auto alignment = bad_alignment(gen);
    const auto bytes = std::uniform_int_distribution<std::size_t>(1, 4 * mib)(gen);
    INFO("alignment " << alignment << ", bytes " << bytes);
    for (memory_resource* r :
         {static_cast<memory_resource*>(&pool), static_cast<memory_resource*>(&limit),
          static_cast<memory_resource*>(&stats)}) {
      try {
        (void)r->allocate(bytes, alignment);
        FAIL("no error");
      } catch (const out_of_capacity&) {
        FAIL("out_of_capacity for a bad alignment");
      } catch (const error& e) {
        CHECK_THAT(e.what(), Catch::Contains(r->name()));
        CHECK_THAT(e.what(), Catch::Contains("alignment " + std::to_string(alignment)));
      }
    }
  }
  CHECK(stats.bytes().current == bytes_before.current);
  CHECK(stats.bytes().total == bytes_before.total);
  CHECK(limit.used_bytes() == used_before);
  CHECK(pool.allocated_bytes() == pool_before);
  pool.deallocate(held, held_bytes);
  CHECK(stats.bytes().current == bytes_before.current);  // the pool keeps its chunk
}

TEST_CASE("bad input: pool deallocate of a foreign pointer or the wrong size is logged",
          "[bad_input][memory]") {
  auto gen = test::rng(0xbad1);
  numa_resource numa(on_node0());
  pool_resource pool(numa, pool_options{4 * mib, 0, 0});
  const auto bytes = std::uniform_int_distribution<std::size_t>(300, mib)(gen);
  void* p = pool.allocate(bytes);
  const auto allocated = pool.allocated_bytes();
  std::vector<unsigned char> foreign(64);
  {
    test::captured_log log;
    pool.deallocate(foreign.data(), foreign.size());
    CHECK_THAT(log.text(), Catch::Contains(pool.name()));
    CHECK_THAT(log.text(), Catch::Contains("did not hand out"));
  }
  CHECK(pool.allocated_bytes() == allocated);  // the foreign pointer changed nothing
  {
    test::captured_log log;
    pool.deallocate(p, bytes + 4096);
    CHECK_THAT(log.text(), Catch::Contains("deallocate with " + std::to_string(bytes + 4096)));
  }
  CHECK(pool.allocated_bytes() == 0);  // the pool's own record of the block is what it frees
}

TEST_CASE("bad input: a limit_resource given back more than it holds logs and does not wrap",
          "[bad_input][memory]") {
  auto gen = test::rng(0xbad2);
  heap_resource heap;
  limit_resource limit(heap, 8 * mib, "tier x");
  const auto bytes = std::uniform_int_distribution<std::size_t>(64, mib)(gen);
  void* p = limit.allocate(bytes);
  {
    test::captured_log log;
    limit.deallocate(p, bytes + 64);  // a caller bug: more than it was given
    CHECK_THAT(log.text(), Catch::Contains("tier x"));
    CHECK_THAT(log.text(), Catch::Contains(std::to_string(bytes + 64)));
  }
  CHECK(limit.used_bytes() == 0);
  CHECK(limit.available_bytes() == 8 * mib);
  void* q = limit.allocate(8 * mib);  // the whole limit is usable again
  limit.deallocate(q, 8 * mib);
  CHECK(heap.live == 0);
}

TEST_CASE("bad input: pool options and reserve beyond any cap are refused with nothing taken",
          "[bad_input][memory]") {
  numa_resource numa(on_node0());
  statistics_resource upstream(numa);
  CHECK_THROWS_WITH(pool_resource(upstream, pool_options{0, 0, 0}),
                    Catch::Contains("chunk_bytes must be above 0"));
  SECTION("a reserve whose rounding overflows") {
    pool_resource pool(upstream, pool_options{4 * mib, 0, 0});
    for (std::uint64_t bytes : {std::numeric_limits<std::uint64_t>::max(),
                                std::numeric_limits<std::uint64_t>::max() - 4 * mib + 2}) {
      INFO("bytes " << bytes);
      try {
        pool.reserve(bytes);
        FAIL("no error");
      } catch (const out_of_capacity& e) {
        CHECK(e.requested_bytes() == bytes);
        CHECK_THAT(e.what(), Catch::Contains(pool.name()));
      }
      CHECK(pool.upstream_bytes() == 0);
      CHECK(upstream.bytes().current == 0);
    }
  }
  SECTION("a reserve beyond max_bytes") {
    auto gen = test::rng(0xbad3);
    const std::size_t chunk = 4 * mib;
    const std::uint64_t cap = 4 * chunk;
    pool_resource pool(upstream, pool_options{chunk, cap, 0});
    const auto bytes = std::uniform_int_distribution<std::uint64_t>(cap + 1, 4 * cap)(gen);
    INFO("bytes " << bytes);
    try {
      pool.reserve(bytes, 2);
      FAIL("no error");
    } catch (const out_of_capacity& e) {
      CHECK(e.requested_bytes() == bytes);
      REQUIRE(e.tiers().size() == 1);
      CHECK(e.tiers()[0].free_bytes == cap);
    }
    CHECK(pool.upstream_bytes() == 0);  // nothing taken before the refusal
    CHECK(upstream.bytes().current == 0);
    pool.reserve(cap);  // what fits still does
    CHECK(pool.upstream_bytes() == cap);
  }
}

TEST_CASE("bad input: where() of a range that wraps the address space is refused",
          "[bad_input][memory]") {
  std::vector<unsigned char> buffer(8192, 1);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (std::size_t bytes : {max, max - address + 3 * 4096}) {
    INFO("bytes " << bytes);
    CHECK_THROWS_WITH(where(buffer.data(), bytes), Catch::Contains("where: ") &&
                                                       Catch::Contains(std::to_string(bytes)) &&
                                                       Catch::Contains("wraps"));
  }
  CHECK(where(nullptr, 4096).total_pages == 0);  // nothing to ask about
  CHECK(where(buffer.data(), 0).total_pages == 0);
  CHECK(where(buffer.data(), buffer.size()).total_pages >= 2);
}

TEST_CASE("bad input: the name parsers return nothing for unknown names", "[bad_input]") {
  auto gen = test::rng(0xbad7);
  const std::string junk = "x" + std::to_string(gen() % 100000);
  CHECK_FALSE(parse_tier_kind(junk));
  CHECK_FALSE(parse_tier_kind("HBM"));  // names are lower case
  CHECK_FALSE(parse_data_class(junk));
  CHECK_FALSE(parse_adam_mode(junk));
  CHECK_FALSE(parse_adam_mode("automatic"));  // the text form is `auto`
  CHECK(parse_adam_mode("auto") == adam_mode::automatic);
}

TEST_CASE("bad input: a measured-attribute cache folder that cannot be made names the path",
          "[bad_input][topology]") {
  auto gen = test::rng(0xbad8);
  test::scratch_dir dir;
  const auto blocker = dir.path() / "a-file";
  test::write_file(blocker, "not a folder\n");
  discovery_options o;
  o.use_cuda = false;
  o.use_measured_cache = false;
  const auto topo = topology::discover(o);
  const auto node = topo.nodes().front().id;
  const double value = std::uniform_real_distribution<double>(1e3, 1e5)(gen);
  try {
    (void)save_measured_access(topo, {{node, node, value, {}, {}}}, blocker / "cache");
    FAIL("no error");
  } catch (const input_error&) {
    FAIL("input_error for a folder the program could not make");
  } catch (const error& e) {
    CHECK_THAT(e.what(), Catch::Contains("cannot create " + (blocker / "cache").string()));
  }
  CHECK(test::read_file(blocker) == "not a folder\n");
}

TEST_CASE("bad input: a usage counter given back more than it holds stops at 0",
          "[bad_input][metrics]") {
  auto gen = test::rng(0xbad9);
  std::uniform_int_distribution<std::uint64_t> amount(1, std::uint64_t{1} << 40);
  metrics::usage_counter counter;
  const auto added = amount(gen);
  counter.add(added);
  counter.sub(added + amount(gen));  // a size mismatch
  const auto reading = counter.read();
  CHECK(reading.current == 0);
  CHECK(reading.peak == added);
  CHECK(reading.total == added);
  // A statistics_resource counts through it: a mismatched deallocate does not wrap it either.
  heap_resource heap;
  statistics_resource stats(heap);
  const auto bytes = static_cast<std::size_t>(amount(gen) % mib + 1);
  void* p = stats.allocate(bytes);
  stats.deallocate(p, bytes + 4096);
  CHECK(stats.bytes().current == 0);
  CHECK(stats.bytes().total == bytes);
  CHECK(heap.live == 0);
}

// --- settings, placement ----------------------------------------------------------------

TEST_CASE("bad input: settings::get of an unknown key is a programming error and not input",
          "[bad_input][settings]") {
  const auto s = settings::from_text("tiers = dram=0\n", "f.conf");
  try {
    (void)s.get("colour");
    FAIL("no error");
  } catch (const input_error&) {
    FAIL("input_error for a key the program chose");
  } catch (const error& e) {
    CHECK_THAT(e.what(), Catch::Contains("unknown settings key 'colour'"));
  }
  CHECK(s.get("tiers")->value == "dram=0");
}

TEST_CASE("bad input: a configuration path that is a folder is an input_error naming it",
          "[bad_input][settings]") {
  test::scratch_dir dir;
  try {
    (void)settings::from_file(dir.path());
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(e.source() == dir.path().string());
  }
}

TEST_CASE("bad input: a bad tiers or placement value in a config file names FILE:LINE",
          "[bad_input][settings]") {
  test::scoped_env no_tiers("TIERFLOW_TIERS", nullptr);
  test::scoped_env no_placement("TIERFLOW_PLACEMENT", nullptr);
  const auto file =
      settings::from_text("# site\ntiers = ssd=0\nplacement = weights=dram\n", "site.conf");
  discovery_options o;
  o.sysfs_root = test::sysfs_fixture("laptop");
  o.config = &file;
  try {
    (void)topology::discover(o);
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(e.source() == "site.conf:2");
    CHECK(e.offending_text() == "ssd=0");
  }
  const auto topo = laptop();
  placement_options po;
  po.config = &file;
  try {
    placement_policy policy(topo, po);
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(e.source() == "site.conf:3");
    CHECK_THAT(e.what(), Catch::Contains("unknown data class 'weights'"));
  }
}

TEST_CASE("bad input: placement_policy and placement_spec calls with bad arguments",
          "[bad_input][placement]") {
  const auto topo = laptop();
  placement_options o;
  o.spec = "params=dram0";
  o.reserve_bytes = 0;
  placement_policy policy(topo, o);
  numa_resource numa(on_node0());
  CHECK_THROWS_WITH(policy.attach_resource("cxl7", numa), Catch::Contains("unknown tier 'cxl7'"));

  auto spec = policy.spec();
  const auto before = spec.describe(data_class::params);
  CHECK_THROWS_WITH(spec.set(data_class::params, {}),
                    Catch::Contains("placement for params needs at least one tier"));
  CHECK_THROWS_WITH(spec.set(data_class::params, {placement_choice{{{"dram0", 0}}}}),
                    Catch::Contains("placement weight 0 for tier dram0"));
  CHECK(spec.describe(data_class::params) == before);

  SECTION("allocate of 0 bytes is an empty allocation that counts nothing") {
    const auto snap = policy.snapshot();
    auto a = policy.allocate(data_class::params, 0);
    CHECK_FALSE(a);
    CHECK(a.size() == 0);
    const auto after = policy.snapshot();
    REQUIRE(after.tiers.size() == snap.tiers.size());
    for (std::size_t i = 0; i < snap.tiers.size(); ++i) {
      CHECK(after.tiers[i].allocations == snap.tiers[i].allocations);
      CHECK(after.tiers[i].held_bytes == snap.tiers[i].held_bytes);
    }
    CHECK(after.class_bytes == snap.class_bytes);
  }
  SECTION("attach after allocating from the tier is refused") {
    auto a = policy.allocate(data_class::params, 4096);
    CHECK_THROWS_WITH(policy.attach_resource("dram0", numa),
                      Catch::Contains("before allocating from it"));
    CHECK(policy.snapshot().tiers.at(0).held_bytes == 4096);
  }
}

// --- device ------------------------------------------------------------------------------

TEST_CASE("bad input: emulated device options and misused events and streams",
          "[bad_input][device]") {
  for (const auto& [spoil, words] :
       std::vector<std::pair<std::function<void(emulated_device_options&)>, std::string>>{
           {[](auto& o) { o.link.h2d_gbps = 0; }, "link bandwidths must be above 0"},
           {[](auto& o) { o.link.d2h_gbps = std::nan(""); }, "link bandwidths must be above 0"},
           {[](auto& o) { o.link.latency = std::chrono::nanoseconds(-1); }, "negative latency"},
           {[](auto& o) { o.hbm_bytes = 0; }, "hbm_bytes must be above 0"}}) {
    emulated_device_options o;
    spoil(o);
    INFO(words);
    CHECK_THROWS_WITH(emulated_device::create(o), Catch::Contains(words));
  }
  auto dev = small_device();
  auto other = small_device();
  auto a = dev->create_event();
  auto b = dev->create_event();
  CHECK_THROWS_WITH(event::elapsed_ms(*a, *b), Catch::Contains("has not been recorded"));
  auto foreign = other->create_event();
  dev->compute_stream().record(*a);
  other->compute_stream().record(*foreign);
  a->synchronize();
  foreign->synchronize();
  CHECK_THROWS_WITH(event::elapsed_ms(*foreign, *a), Catch::Contains("same emulated device"));
  CHECK_THROWS_WITH(dev->compute_stream().host_callback({}), Catch::Contains("empty function"));
  CHECK_THROWS_WITH(dev->fail_copy(other->h2d_stream(), 1),
                    Catch::Contains("a stream of another device"));
  CHECK_THROWS_WITH(dev->delay_stream(other->d2h_stream(), std::chrono::milliseconds(1)),
                    Catch::Contains("a stream of another device"));
  std::vector<unsigned char> host(64);
  void* d = dev->memory().allocate(64);
  CHECK_THROWS_WITH(dev->copy_async(d, nullptr, 64, copy_kind::h2d, dev->h2d_stream()),
                    Catch::Contains("null pointer"));
  const auto free_before = dev->memory_free_bytes();
  CHECK_THROWS_AS(dev->memory().allocate(std::uint64_t{65} << 20), out_of_capacity);
  CHECK(dev->memory_free_bytes() == free_before);
  dev->memory().deallocate(d, 64);
  dev->synchronize();  // nothing was enqueued by the refused calls
}

TEST_CASE("bad input: device specs and TIERFLOW_EMU_LINK name the source and the text",
          "[bad_input][device]") {
  auto gen = test::rng(0xbad4);
  const std::string junk = "gpu" + std::to_string(gen() % 1000);
  try {
    (void)open_device(junk);
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(e.source() == "device spec");
    CHECK(e.offending_text() == junk);
  }
  const std::string link = "h2d=" + std::to_string(gen() % 100 + 1) + "furlongs";
  test::scoped_env env("TIERFLOW_EMU_LINK", link.c_str());
  try {
    (void)link_model::from_environment();
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(e.source() == "env TIERFLOW_EMU_LINK");
    CHECK_THAT(e.what(), Catch::Contains("furlongs"));
  }
}

TEST_CASE("bad input: transfer_engine routes and pointers", "[bad_input][transfer]") {
  auto dev = small_device();
  transfer_engine engine(*dev, transfer_options{mib, 2});
  CHECK_THROWS_WITH(engine.register_route(memory_space::host, memory_space::host, {}),
                    Catch::Contains("empty route"));
  int a = 7, b = 0;
  CHECK_THROWS_WITH(engine.copy(&b, memory_space::host, nullptr, memory_space::host, 4),
                    Catch::Contains("null pointer"));
  engine.copy(&b, memory_space::host, &a, memory_space::host, sizeof a)->synchronize();
  CHECK(b == 7);  // the refused calls left the engine and its routes working
  CHECK(engine.link("h2h").transfers == 1);
  CHECK(engine.link("no such link").transfers == 0);  // an unknown link has carried nothing
}

// --- schedule ----------------------------------------------------------------------------

TEST_CASE("bad input: a buffer too large to align is refused and not counted as 0 bytes",
          "[bad_input][scheduler]") {
  auto dev = small_device();
  std::vector<unsigned char> small(4096, 1);
  const std::size_t huge = std::numeric_limits<std::size_t>::max() - 100;
  schedule_plan plan;
  plan.add_buffer({"huge", small.data(), huge, false, true});
  plan.add_step({"use", {0}, {}});
  scheduler_options o;
  o.hbm_budget_bytes = mib;
  const auto free_before = dev->memory_free_bytes();
  CHECK_THROWS_WITH(prefetch_scheduler(*dev, plan, o),
                    Catch::Contains("buffer 'huge'") && Catch::Contains("too large"));
  CHECK(dev->memory_free_bytes() == free_before);

  schedule_model_options m;
  m.hbm_budget_bytes = mib;
  m.h2d = m.d2h = link_fit{10.0, 1e-6};
  CHECK_THROWS_WITH(predict_schedule(plan, {1e-3}, m),
                    Catch::Contains("buffer 'huge'") && Catch::Contains("too large"));

  // Two buffers of 2^63 bytes in one step: each aligns, but their sum wraps to 0 (the model
  // does not look at the pointers; the scheduler refuses them as overlapping).
  schedule_plan twins;
  twins.add_buffer({"left", nullptr, std::size_t{1} << 63, false, false});
  twins.add_buffer({"right", nullptr, std::size_t{1} << 63, false, false});
  twins.add_step({"both", {0}, {1}});
  CHECK_THROWS_WITH(predict_schedule(twins, {1e-3}, m),
                    Catch::Contains("step 'both'") && Catch::Contains("too large"));
}

// --- optim -------------------------------------------------------------------------------

TEST_CASE("bad input: offload_adam accessors out of range and parameter counts too large",
          "[bad_input][adam]") {
  auto gen = test::rng(0xbad5);
  const topology topo = topology::discover();
  placement_options po;
  po.reserve_bytes = 0;
  po.huge_pages = false;
  placement_policy policy(topo, po);
  auto dev = small_device();
  const std::size_t n = std::uniform_int_distribution<std::size_t>(10, 500)(gen);
  void* param = dev->memory().allocate(n * 4);
  void* grad = dev->memory().allocate(n * 4);
  std::vector<float> init(n);
  for (auto& x : init) {
    x = std::normal_distribution<float>(0.0f, 1.0f)(gen);
  }
  std::memcpy(param, init.data(), n * 4);  // emulated device memory is host memory
  std::memset(grad, 0, n * 4);
  adam_group g;
  g.params.push_back({"w", param, grad, param_dtype::f32, n, false});
  adam_options o;
  o.mode = adam_mode::cpu;
  o.threads = 1;

  SECTION("an element count whose state size overflows") {
    const auto held = policy.snapshot();
    for (std::size_t elements : {std::numeric_limits<std::size_t>::max() / 4 + 2,
                                 std::numeric_limits<std::size_t>::max() / 8 + 1}) {
      auto bad = g;
      bad.params[0].elements = elements;
      INFO("elements " << elements);
      CHECK_THROWS_WITH(offload_adam(*dev, {bad}, o, policy),
                        Catch::Contains("'w'") && Catch::Contains(std::to_string(elements)) &&
                            Catch::Contains("too many"));
    }
    const auto after = policy.snapshot();
    for (std::size_t i = 0; i < held.tiers.size(); ++i) {
      CHECK(after.tiers[i].held_bytes == held.tiers[i].held_bytes);
    }
  }
  SECTION("a kernel this CPU lacks, and negative measured rates") {
    for (auto kernel : {adam_kernel::avx2, adam_kernel::avx512}) {
      auto ko = o;
      ko.kernel = kernel;
      if (kernel_supported(kernel)) {
        continue;  // this CPU runs it: nothing to refuse here
      }
      CHECK_THROWS_WITH(offload_adam(*dev, {g}, ko, policy),
                        Catch::Contains("cannot run the " + std::string(to_string(kernel))));
    }
    auto ro = o;
    ro.h2d_gbps = -std::uniform_real_distribution<double>(0.1, 100.0)(gen);
    CHECK_THROWS_WITH(offload_adam(*dev, {g}, ro, policy),
                      Catch::Contains("measured rates must be finite and >= 0"));
  }
  SECTION("accessors") {
    offload_adam opt(*dev, {g}, o, policy);
    CHECK_THROWS_WITH(opt.hyper(1), Catch::Contains("group 1 out of range (1 groups)"));
    CHECK_THROWS_WITH(opt.step_count(7), Catch::Contains("group 7 out of range"));
    CHECK_THROWS_WITH(opt.exp_avg(0, 1), Catch::Contains("param 1 of group 0 out of range"));
    CHECK_THROWS_WITH(opt.exp_avg_sq(2, 0), Catch::Contains("group 2 out of range"));
    CHECK_THROWS_WITH(opt.state_residency(data_class::grads), Catch::Contains("not grads"));
    CHECK_THROWS_WITH(opt.set_lr(std::numeric_limits<double>::infinity()),
                      Catch::Contains("lr must be finite"));
    adam_hyper h;
    h.beta1 = -0.1;
    CHECK_THROWS_WITH(opt.set_hyper(0, h), Catch::Contains("beta1"));
    CHECK(opt.hyper(0).beta1 == adam_hyper{}.beta1);
    CHECK(opt.hyper(0).lr == adam_hyper{}.lr);
    CHECK(opt.step_count(0) == 0);
    CHECK(opt.master_weights(0, 0) == init);  // nothing stepped, nothing changed
    test::scratch_dir dir;
    CHECK_THROWS_AS(opt.load(dir.path()), input_error);  // a folder, not a checkpoint
    CHECK(opt.master_weights(0, 0) == init);
  }
  dev->memory().deallocate(param, n * 4);
  dev->memory().deallocate(grad, n * 4);
}

// --- C ABI -------------------------------------------------------------------------------

TEST_CASE("bad input: every C function refuses NULL and bad values with a status and a message",
          "[bad_input][capi]") {
  auto gen = test::rng(0xbad6);
  tf_adam_hyper_default(nullptr);  // no-ops, no crash
  tf_adam_options_default(nullptr);
  tf_device_destroy(nullptr);
  tf_adam_destroy(nullptr);
  CHECK(std::string(tf_device_backend(nullptr)).empty());

  tf_device* dev = nullptr;
  REQUIRE(tf_device_open("emulated", &dev) == TF_OK);
  void* p = nullptr;
  CHECK(tf_device_alloc(nullptr, 64, &p) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("tf_device_alloc: device is NULL"));
  CHECK(tf_device_alloc(dev, 64, nullptr) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("out is NULL"));
  CHECK(tf_device_alloc(dev, std::numeric_limits<std::size_t>::max() / 2, &p) ==
        TF_ERR_OUT_OF_MEMORY);
  CHECK_THAT(tf_last_error(), Catch::Contains("tf_device_alloc: emulated hbm"));
  CHECK(p == nullptr);
  CHECK(tf_device_alloc(dev, 0, &p) == TF_OK);
  CHECK(p == nullptr);
  CHECK(tf_device_free(nullptr, p, 0) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_device_free(dev, nullptr, 0) == TF_OK);

  const std::size_t n = std::uniform_int_distribution<std::size_t>(16, 256)(gen);
  void* d_param = nullptr;
  void* d_grad = nullptr;
  REQUIRE(tf_device_alloc(dev, n * 4, &d_param) == TF_OK);
  REQUIRE(tf_device_alloc(dev, n * 4, &d_grad) == TF_OK);
  std::vector<float> host(n);
  for (auto& x : host) {
    x = std::normal_distribution<float>(0.0f, 1.0f)(gen);
  }
  REQUIRE(tf_device_copy(dev, d_param, host.data(), n * 4, TF_COPY_H2D) == TF_OK);
  std::vector<float> zeros(n, 0.0f);
  REQUIRE(tf_device_copy(dev, d_grad, zeros.data(), n * 4, TF_COPY_H2D) == TF_OK);
  CHECK(tf_device_copy(nullptr, d_param, host.data(), 4, TF_COPY_H2D) == TF_ERR_INVALID_ARGUMENT);
  // A kind outside the enum is checked in C (tests/capi/test_c_abi.c): C++ cannot form it.
  CHECK(tf_device_copy(dev, nullptr, host.data(), 4, TF_COPY_H2D) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(),
             Catch::Contains("tf_device_copy: ") && Catch::Contains("null pointer"));

  tf_adam_hyper hyper;
  tf_adam_hyper_default(&hyper);
  tf_adam_options options;
  tf_adam_options_default(&options);
  options.mode = TF_ADAM_CPU;
  options.threads = 1;
  tf_adam_param param{"w", d_param, d_grad, TF_DTYPE_F32, n, 0, 0};
  tf_adam* adam = nullptr;
  const auto refused = [&](tf_adam_param given, const tf_adam_hyper* h, std::size_t count,
                           std::size_t groups, const tf_adam_options* opts, tf_status status,
                           const std::string& words) {
    INFO(words);
    adam = reinterpret_cast<tf_adam*>(&given);  // must be reset to NULL on failure
    CHECK(tf_adam_create(dev, &given, count, h, groups, opts, &adam) == status);
    CHECK(adam == nullptr);
    CHECK_THAT(tf_last_error(), Catch::StartsWith("tf_adam_create: ") && Catch::Contains(words));
  };
  refused(param, &hyper, 0, 1, &options, TF_ERR_INVALID_ARGUMENT, "count and groups must be > 0");
  refused(param, nullptr, 1, 1, &options, TF_ERR_INVALID_ARGUMENT, "hypers is NULL");
  {
    auto bad = param;
    bad.dtype = static_cast<tf_dtype>(3);
    refused(bad, &hyper, 1, 1, &options, TF_ERR_INVALID_ARGUMENT, "params[0]: unknown dtype 3");
  }
  {
    auto bad = options;
    bad.mode = static_cast<tf_adam_mode>(3);
    refused(param, &hyper, 1, 1, &bad, TF_ERR_INVALID_ARGUMENT, "options->mode");
    bad = options;
    bad.loss_scale = 0;
    refused(param, &hyper, 1, 1, &bad, TF_ERR_INVALID_ARGUMENT, "loss_scale");
  }
  {
    auto bad = param;
    bad.elements = std::numeric_limits<std::size_t>::max() / 4 + 2;
    refused(bad, &hyper, 1, 1, &options, TF_ERR_INVALID_ARGUMENT, "too many");
  }
  CHECK(tf_adam_create(nullptr, &param, 1, &hyper, 1, &options, &adam) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("device is NULL"));

  REQUIRE(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam) == TF_OK);
  CHECK(tf_adam_set_lr(adam, std::nan("")) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("lr"));
  CHECK(tf_adam_set_lr(nullptr, 1e-3) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_set_hyper(adam, 0, nullptr) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("hyper is NULL"));
  CHECK(tf_adam_set_hyper(adam, 3, &hyper) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("group 3 out of range"));
  unsigned long long count = 99;
  CHECK(tf_adam_step_count(adam, 0, nullptr) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_step_count(adam, 1, &count) == TF_ERR_INVALID_ARGUMENT);
  CHECK(count == 99);  // untouched on failure
  CHECK(tf_adam_step_count(nullptr, 0, &count) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_mode_in_force(adam, nullptr) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_mode_in_force(nullptr, nullptr) == TF_ERR_INVALID_ARGUMENT);
  std::size_t needed = 0;
  CHECK(tf_adam_metrics_json(nullptr, nullptr, 0, &needed) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_metrics_json(adam, nullptr, 0, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > 1);
  CHECK_THAT(tf_last_error(), Catch::Contains(std::to_string(needed) + " bytes, 0 given"));
  CHECK(tf_adam_save(adam, nullptr) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("tf_adam_save: path is NULL"));
  CHECK(tf_adam_save(nullptr, "/tmp/x") == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_load(adam, nullptr) == TF_ERR_INVALID_ARGUMENT);
  test::scratch_dir dir;
  const auto truncated = dir.path() / "cut.tfck";
  REQUIRE(tf_adam_save(adam, truncated.c_str()) == TF_OK);
  const auto size = std::filesystem::file_size(truncated);
  std::filesystem::resize_file(truncated,
                               std::uniform_int_distribution<std::uintmax_t>(0, size - 1)(gen));
  CHECK(tf_adam_load(adam, truncated.c_str()) == TF_ERR_INPUT);
  CHECK_THAT(tf_last_error(), Catch::Contains(truncated.string()));
  std::vector<float> master(n, -1.0f);
  CHECK(tf_adam_master_weights(adam, 1, master.data(), n) == TF_ERR_INVALID_ARGUMENT);
  CHECK_THAT(tf_last_error(), Catch::Contains("index 1 out of range (1 params)"));
  CHECK(tf_adam_master_weights(adam, 0, nullptr, n) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_master_weights(nullptr, 0, master.data(), n) == TF_ERR_INVALID_ARGUMENT);
  CHECK(master == std::vector<float>(n, -1.0f));
  REQUIRE(tf_adam_master_weights(adam, 0, master.data(), n) == TF_OK);
  CHECK(master == host);  // every refused call left the state as it was
  REQUIRE(tf_adam_step_count(adam, 0, &count) == TF_OK);
  CHECK(count == 0);
  tf_adam_destroy(adam);
  CHECK(tf_device_free(dev, d_param, n * 4) == TF_OK);
  CHECK(tf_device_free(dev, d_grad, n * 4) == TF_OK);
  tf_device_destroy(dev);
}
