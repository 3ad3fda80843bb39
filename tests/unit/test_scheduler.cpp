// The prefetch scheduler on the emulated device: random plans, windows and budgets against a
// serial reference, bit-exact; failures, destruction mid-iteration, exports.

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "schedule/staging_arena.hpp"
#include "test_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/prefetch_scheduler.hpp"

using namespace tierflow;

namespace {

std::uint64_t fnv(const unsigned char* p, std::size_t n, std::uint64_t h) {
  for (std::size_t i = 0; i < n; ++i) {
    h = (h ^ p[i]) * 0x100000001b3ULL;
  }
  return h;
}

// The work of a step: a checksum of everything it uses (what it saw), then every buffer it
// writes becomes a function of that checksum and its old bytes.
std::uint64_t step_work(std::size_t step, std::uint64_t iteration,
                        const std::vector<std::pair<unsigned char*, std::size_t>>& uses,
                        const std::vector<std::pair<unsigned char*, std::size_t>>& writes) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ (step * 0x9e3779b97f4a7c15ULL) ^ iteration;
  for (const auto& [p, n] : uses) {
    h = fnv(p, n, h);
  }
  for (const auto& [p, n] : writes) {
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = static_cast<unsigned char>(p[i] * 167u + (h >> (8 * (i % 8))) + i * 13u + 1u);
    }
  }
  return h;
}

std::vector<buffer_id> sorted_unique(std::vector<buffer_id> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// A plan over host buffers the case owns, and the runs (step indices) to drive through it.
struct scenario {
  std::vector<std::vector<unsigned char>> host;
  schedule_plan plan;
  scheduler_options options;
  std::size_t first_step = 0;
  std::size_t runs = 0;

  std::uint64_t aligned(std::size_t n) const {
    return (n + options.alignment - 1) / options.alignment * options.alignment;
  }
  // Resident bytes plus the largest step's staging: the least budget that must work.
  std::uint64_t least_budget() const {
    std::uint64_t resident = 0, largest = 0;
    for (const auto& b : plan.buffers) {
      resident += b.resident ? aligned(b.bytes) : 0;
    }
    for (const auto& st : plan.steps) {
      std::vector<buffer_id> all = st.reads;
      all.insert(all.end(), st.writes.begin(), st.writes.end());
      std::uint64_t bytes = 0;
      for (const auto id : sorted_unique(all)) {
        bytes += plan.buffers[id].resident ? 0 : aligned(plan.buffers[id].bytes);
      }
      largest = std::max(largest, bytes);
    }
    return resident + largest;
  }
  std::uint64_t resident_bytes() const {
    std::uint64_t r = 0;
    for (const auto& b : plan.buffers) {
      r += b.resident ? aligned(b.bytes) : 0;
    }
    return r;
  }
};

scenario random_scenario(std::mt19937_64& gen) {
  scenario sc;
  auto pick = [&](std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(gen);
  };
  const auto buffers = pick(1, 10);
  for (std::size_t i = 0; i < buffers; ++i) {
    const auto bytes = pick(0, 3) == 0 ? pick(1, 300) : pick(1, 48 << 10);
    sc.host.push_back(test::random_bytes(bytes, gen));
  }
  for (std::size_t i = 0; i < buffers; ++i) {
    sc.plan.add_buffer(
        {"buf" + std::to_string(i), sc.host[i].data(), sc.host[i].size(), pick(0, 6) == 0, false});
  }
  const auto steps = pick(1, 7);
  for (std::size_t s = 0; s < steps; ++s) {
    step_desc st{"step" + std::to_string(s), {}, {}};
    for (auto k = pick(0, 3); k > 0; --k) {
      st.reads.push_back(static_cast<buffer_id>(pick(0, buffers - 1)));
    }
    for (auto k = pick(0, 2); k > 0; --k) {
      st.writes.push_back(static_cast<buffer_id>(pick(0, buffers - 1)));
    }
    sc.plan.add_step(st);
  }
  sc.options.alignment = std::size_t{64} << pick(0, 6);
  std::uint64_t total = 0;
  for (const auto& b : sc.plan.buffers) {
    total += sc.aligned(b.bytes);
  }
  const auto least = sc.least_budget();
  sc.options.hbm_budget_bytes = std::max<std::uint64_t>(
      1, pick(0, 2) == 0 ? least : least + pick(0, static_cast<std::size_t>(total) * 2));
  switch (pick(0, 6)) {
    case 0:
      sc.options.window = 0;
      break;
    case 1:
      sc.options.window = 1;
      break;
    case 2:
      sc.options.window = std::uint64_t{1} << 40;  // huge
      break;
    case 3:
      sc.options.unit = window_unit::bytes;
      sc.options.window = pick(0, static_cast<std::size_t>(total) * 2);
      break;
    case 4:
      sc.options.adaptive = true;
      sc.options.max_window = pick(1, 6);
      break;
    default:
      sc.options.window = pick(2, 12);
  }
  sc.first_step = pick(0, steps - 1);
  sc.runs = pick(1, 5 * steps);
  return sc;
}

std::unique_ptr<emulated_device> fast_device() {
  emulated_device_options o;
  o.link = link_model::parse("h2d=40GB/s,d2h=40GB/s,latency=1us", "test");
  o.copy_threads = 1;
  o.hbm_bytes = std::uint64_t{1} << 30;
  return emulated_device::create(o);
}

// The serial reference: the runs applied in order to copies of the host bytes. Records what
// each run saw and every version of every buffer.
struct reference {
  std::vector<std::vector<unsigned char>> state;
  std::vector<std::uint64_t> seen;
  std::vector<std::vector<std::vector<unsigned char>>> versions;  // per buffer

  explicit reference(const std::vector<std::vector<unsigned char>>& initial) : state(initial) {
    for (const auto& b : initial) {
      versions.push_back({b});
    }
  }
  void apply(const schedule_plan& plan, std::size_t first, std::size_t runs,
             std::uint64_t first_iteration = 0) {
    const auto n = plan.steps.size();
    for (std::size_t r = 0; r < runs; ++r) {
      const auto seq = first_iteration * n + first + r;
      const auto step = seq % n;
      const auto& st = plan.steps[step];
      std::vector<buffer_id> all = st.reads;
      all.insert(all.end(), st.writes.begin(), st.writes.end());
      std::vector<std::pair<unsigned char*, std::size_t>> uses, writes;
      for (const auto id : sorted_unique(all)) {
        uses.emplace_back(state[id].data(), state[id].size());
      }
      for (const auto id : sorted_unique(st.writes)) {
        writes.emplace_back(state[id].data(), state[id].size());
      }
      seen.push_back(step_work(step, seq / n, uses, writes));
      for (const auto id : sorted_unique(st.writes)) {
        versions[id].push_back(state[id]);
      }
    }
  }
};

// The reference run of a scenario's runs.
reference expected(const scenario& sc) {
  reference ref(sc.host);
  ref.apply(sc.plan, sc.first_step, sc.runs);
  return ref;
}

// Drives @p runs runs through @p sched from @p first: each run's work is a host callback on the
// compute stream that reads and writes the staged copies. @p seen gets what each run saw.
// Returns the iteration the first run belonged to.
std::uint64_t drive(prefetch_scheduler& sched, std::size_t first, std::size_t runs,
                    std::vector<std::uint64_t>& seen) {
  std::uint64_t first_iteration = 0;
  const auto& plan = sched.plan();
  const auto n = plan.steps.size();
  seen.assign(runs, 0);
  for (std::size_t r = 0; r < runs; ++r) {
    const auto step = (first + r) % n;
    const auto& staged = sched.acquire(step);
    first_iteration = r == 0 ? staged.iteration() : first_iteration;
    const auto& st = plan.steps[step];
    std::vector<buffer_id> all = st.reads;
    all.insert(all.end(), st.writes.begin(), st.writes.end());
    std::vector<std::pair<unsigned char*, std::size_t>> uses, writes;
    for (const auto id : sorted_unique(all)) {
      uses.emplace_back(static_cast<unsigned char*>(staged.pointer(id)), plan.buffers[id].bytes);
    }
    for (const auto id : sorted_unique(st.writes)) {
      writes.emplace_back(static_cast<unsigned char*>(staged.pointer(id)), plan.buffers[id].bytes);
    }
    staged.compute().host_callback(
        [step, iteration = staged.iteration(), uses, writes, out = &seen[r]] {
          *out = step_work(step, iteration, uses, writes);
        });
    sched.release(step);
  }
  return first_iteration;
}

std::string describe(const scenario& sc) {
  std::ostringstream s;
  s << sc.plan.buffers.size() << " buffers, " << sc.plan.steps.size() << " steps, budget "
    << sc.options.hbm_budget_bytes << " (least " << sc.least_budget() << "), window "
    << sc.options.window << " " << to_string(sc.options.unit)
    << (sc.options.adaptive ? " adaptive" : "") << ", align " << sc.options.alignment << ", runs "
    << sc.runs << " from step " << sc.first_step;
  return s.str();
}

std::uint64_t locked_kib() {
  std::istringstream in(test::read_file("/proc/self/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) {
      return std::stoull(line.substr(6));
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("random plans, windows and budgets match the serial reference bit for bit",
          "[scheduler]") {
  auto gen = test::rng(701);
  for (int c = 0; c < 40; ++c) {
    auto sc = random_scenario(gen);
    INFO("case " << c << ": " << describe(sc));
    const auto ref = expected(sc);
    auto dev = fast_device();
    std::vector<std::uint64_t> seen;
    {
      prefetch_scheduler sched(*dev, sc.plan, sc.options);
      drive(sched, sc.first_step, sc.runs, seen);
      sched.flush();
      const auto m = sched.metrics();
      CHECK(m.steps == sc.runs);
      CHECK(m.hbm_staging_peak_bytes + sc.resident_bytes() <= sc.options.hbm_budget_bytes);
      CHECK(m.hbm_resident_bytes == sc.resident_bytes());
      CHECK(m.bytes_in == m.h2d.bytes);
      CHECK(m.bytes_out == m.d2h.bytes);
      std::uint64_t per_step_in = 0;
      for (const auto& s : m.per_step) {
        per_step_in += s.bytes_in;
      }
      CHECK(per_step_in == m.bytes_in);
      CHECK(m.stall_seconds >= 0);
      CHECK(m.failed_steps == 0);
    }
    CHECK((seen == ref.seen));  // every run saw exactly its buffers' current bytes
    for (std::size_t b = 0; b < sc.host.size(); ++b) {
      INFO("buffer " << b);
      CHECK((sc.host[b] == ref.state[b]));  // every write-back landed
    }
  }
}

TEST_CASE("the window decides how far ahead the scheduler fetches", "[scheduler]") {
  auto gen = test::rng(702);
  // Eight steps, each with a buffer of its own: the staging peak shows the window.
  scenario sc;
  for (int i = 0; i < 8; ++i) {
    sc.host.push_back(test::random_bytes(4096, gen));
    sc.plan.add_buffer({"b" + std::to_string(i), sc.host.back().data(), 4096, false, false});
    sc.plan.add_step({"s" + std::to_string(i), {static_cast<buffer_id>(i)}, {}});
  }
  sc.options.hbm_budget_bytes = 64 << 10;
  for (const std::uint64_t w : {0u, 1u, 3u, 100u}) {
    INFO("window " << w);
    sc.options.window = w;
    auto dev = fast_device();
    prefetch_scheduler sched(*dev, sc.plan, sc.options);
    std::vector<std::uint64_t> seen;
    drive(sched, 0, 24, seen);
    sched.flush();
    const auto m = sched.metrics();
    // Steps in HBM at once: the acquired one plus the window (at most the whole plan).
    CHECK(m.hbm_staging_peak_bytes == 4096 * std::min<std::uint64_t>(w + 1, 8));
    // A window of a whole plan keeps every buffer staged: each is fetched once.
    CHECK(m.bytes_in == (w >= 7 ? 8 : 24) * 4096);
    CHECK(m.window == w);
    CHECK(m.iterations == 2);
  }
  SECTION("in bytes") {
    sc.options.unit = window_unit::bytes;
    sc.options.window = 3 * 4096 + 100;  // three steps fit, the fourth does not
    auto dev = fast_device();
    prefetch_scheduler sched(*dev, sc.plan, sc.options);
    std::vector<std::uint64_t> seen;
    drive(sched, 0, 16, seen);
    sched.flush();
    CHECK(sched.metrics().hbm_staging_peak_bytes == 4 * 4096);
  }
}

TEST_CASE("prefetch across iterations: what flush drops is counted, and can be avoided",
          "[scheduler]") {
  auto gen = test::rng(711);
  // Six steps with a buffer each (random sizes); window w stages the next iteration's first w.
  scenario sc;
  std::uniform_int_distribution<std::size_t> size(1, 64);
  for (int i = 0; i < 6; ++i) {
    sc.host.push_back(test::random_bytes(64 * size(gen), gen));
    sc.plan.add_buffer(
        {"b" + std::to_string(i), sc.host.back().data(), sc.host.back().size(), false, false});
    sc.plan.add_step({"s" + std::to_string(i), {static_cast<buffer_id>(i)}, {}});
  }
  sc.options.hbm_budget_bytes = 64 << 10;
  const std::uint64_t w = std::uniform_int_distribution<std::uint64_t>(1, 4)(gen);
  sc.options.window = w;
  INFO("window " << w);
  std::uint64_t first_w = 0, all = 0;  // bytes of the plan's first w steps, and of all
  for (std::size_t i = 0; i < sc.host.size(); ++i) {
    first_w += i < w ? sc.host[i].size() : 0;
    all += sc.host[i].size();
  }
  for (const bool across : {true, false}) {
    INFO("prefetch_across_iterations " << across);
    sc.options.prefetch_across_iterations = across;
    auto dev = fast_device();
    prefetch_scheduler sched(*dev, sc.plan, sc.options);
    std::vector<std::uint64_t> seen;
    for (int it = 0; it < 3; ++it) {
      // The tier copies change between iterations, as an optimizer step changes the weights.
      drive(sched, 0, sc.plan.steps.size(), seen);
      sched.flush();
      for (auto& h : sc.host) {
        h[0] = static_cast<unsigned char>(h[0] + 1);
      }
    }
    const auto m = sched.metrics();
    CHECK(m.bytes_in == 3 * all);  // every run fetched its buffer after the flush
    CHECK(m.bytes_discarded == (across ? 3 * first_w : 0));
  }
}

TEST_CASE("a budget that fits only the largest step still runs, one step at a time",
          "[scheduler]") {
  auto gen = test::rng(703);
  for (int c = 0; c < 10; ++c) {
    auto sc = random_scenario(gen);
    sc.options.hbm_budget_bytes = std::max<std::uint64_t>(sc.least_budget(), 1);
    sc.options.window = std::uint64_t{1} << 40;
    sc.options.unit = window_unit::steps;
    sc.options.adaptive = false;
    INFO(describe(sc));
    const auto ref = expected(sc);
    auto dev = fast_device();
    std::vector<std::uint64_t> seen;
    {
      prefetch_scheduler sched(*dev, sc.plan, sc.options);
      drive(sched, sc.first_step, sc.runs, seen);
    }  // the destructor writes back
    CHECK((seen == ref.seen));
    CHECK((sc.host == ref.state));
  }
}

TEST_CASE("a zero budget is the one default: resident + (window + 2) x the largest step",
          "[scheduler]") {
  auto gen = test::rng(709);
  auto dev = fast_device();
  std::uniform_int_distribution<std::size_t> size(1, 5000);
  std::vector<std::vector<unsigned char>> host(4);
  for (auto& h : host) {
    h.assign(size(gen), 7);
  }
  schedule_plan p;
  for (std::size_t i = 0; i < host.size(); ++i) {
    p.add_buffer({"w" + std::to_string(i), host[i].data(), host[i].size(), i == 3, false});
  }
  p.add_step({"s0", {0, 1}, {}});
  p.add_step({"s1", {2, 3}, {}});
  const auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::uint64_t largest =
      std::max(up(host[0].size()) + up(host[1].size()), up(host[2].size()));
  for (const std::uint64_t window : {0, 1, 3}) {
    scheduler_options o;
    o.window = window;
    const std::uint64_t expected_budget = up(host[3].size()) + (window + 2) * largest;
    INFO("window " << window << ", sizes " << host[0].size() << " " << host[1].size() << " "
                   << host[2].size() << " " << host[3].size());
    CHECK(default_hbm_budget(p, o) == expected_budget);
    prefetch_scheduler sched(*dev, p, o);
    CHECK(sched.metrics().hbm_budget_bytes == expected_budget);
  }
  scheduler_options huge;
  huge.window = std::numeric_limits<std::uint64_t>::max() - 1;
  CHECK_THROWS_WITH(default_hbm_budget(p, huge), Catch::Contains("too large"));
}

TEST_CASE("bad plans and options are refused at construction with the reason",
          "[scheduler][errors]") {
  auto dev = fast_device();
  std::vector<unsigned char> a(1000, 1), b(2000, 2);
  auto plan = [&] {
    schedule_plan p;
    p.add_buffer({"a", a.data(), a.size(), false, false});
    p.add_buffer({"b", b.data(), b.size(), false, false});
    p.add_step({"both", {0}, {1}});
    return p;
  };
  scheduler_options o;
  o.hbm_budget_bytes = 1 << 20;
  const auto refused = [&](schedule_plan p, scheduler_options opt, const std::string& why) {
    INFO(why);
    CHECK_THROWS_WITH(prefetch_scheduler(*dev, std::move(p), opt), Catch::Contains(why));
  };
  {
    auto p = plan();
    p.buffers[0].data = nullptr;
    refused(p, o, "buffer 'a' is null");
  }
  {
    auto p = plan();
    p.buffers[1].bytes = 0;
    refused(p, o, "buffer 'b' has 0 bytes");
  }
  {
    auto p = plan();
    p.buffers[1].name = "a";
    refused(p, o, "two buffers are named 'a'");
  }
  {
    auto p = plan();
    p.buffers[1].data = a.data() + 500;
    refused(p, o, "overlap in host memory");
  }
  {
    auto p = plan();
    p.steps[0].writes.push_back(7);
    refused(p, o, "step 'both' names buffer 7 of 2");
  }
  {
    auto p = plan();
    p.add_step({"both", {0}, {}});
    refused(p, o, "two steps are named 'both'");
  }
  refused(schedule_plan{}, o, "the plan has no steps");
  {
    auto opt = o;
    opt = o;
    opt.alignment = 48;
    refused(plan(), opt, "alignment must be a power of two");
    opt = o;
    opt.adaptive = true;
    opt.unit = window_unit::bytes;
    refused(plan(), opt, "adaptive window counts steps");
    opt = o;
    opt.hbm_budget_bytes = 2999;  // 1024 + 2048 aligned to 256 = 3072 needed
    refused(plan(), opt, "step 'both' needs 3.0 KiB of staging");
    auto p = plan();
    p.buffers[0].resident = true;
    opt.hbm_budget_bytes = 2048 + 512;
    refused(p, opt, "on top of 1.0 KiB of resident buffers");
  }
  SECTION("a budget the device cannot give is out_of_capacity") {
    auto opt = o;
    opt.hbm_budget_bytes = std::uint64_t{2} << 30;  // the device has 1 GiB
    CHECK_THROWS_AS(prefetch_scheduler(*dev, plan(), opt), out_of_capacity);
  }
  SECTION("misuse of acquire and release is refused and changes nothing") {
    prefetch_scheduler sched(*dev, plan(), o);
    CHECK_THROWS_WITH(sched.acquire(1), Catch::Contains("step 1 of a plan of 1"));
    CHECK_THROWS_WITH(sched.release(0), Catch::Contains("is not the acquired step"));
    (void)sched.acquire(0);
    CHECK_THROWS_WITH(sched.acquire(0), Catch::Contains("was acquired and not released"));
    CHECK_THROWS_WITH(sched.flush(), Catch::Contains("was acquired and not released"));
    CHECK_THROWS_AS(sched.resident_pointer(0), error);
    CHECK_THROWS_WITH(sched.acquire(0).pointer(5), Catch::Contains("acquired and not released"));
    sched.release(0);
    CHECK_THROWS_WITH(sched.acquire(0).pointer(5), Catch::Contains("buffer 5 is neither used"));
    sched.release(0);
    sched.flush();
    CHECK(sched.metrics().steps == 2);
  }
}

TEST_CASE("steps go in plan order, wrapping across iterations", "[scheduler][errors]") {
  auto dev = fast_device();
  std::vector<unsigned char> a(100, 3);
  schedule_plan p;
  p.add_buffer({"a", a.data(), a.size(), false, false});
  p.add_step({"first", {0}, {}});
  p.add_step({"second", {}, {0}});
  p.add_step({"third", {0}, {}});
  prefetch_scheduler sched(*dev, p, {1 << 20});
  CHECK(sched.acquire(1).iteration() == 0);  // any first step
  sched.release(1);
  CHECK_THROWS_WITH(sched.acquire(0), Catch::Contains("step 'first' out of order; the next "
                                                      "step is 'third'"));
  sched.release(sched.acquire(2).step());
  const auto& s = sched.acquire(0);
  CHECK(s.iteration() == 1);
  CHECK(s.step() == 0);
  sched.release(0);
}

TEST_CASE(
    "a failed transfer is reported, leaves every tier copy consistent, and the scheduler "
    "works again once the fault is gone",
    "[scheduler][faults]") {
  auto gen = test::rng(704);
  int injected = 0;
  for (int c = 0; c < 24; ++c) {
    auto sc = random_scenario(gen);
    sc.options.adaptive = false;  // the same decisions on the faulty run as on the clean one
    const bool h2d = c % 2 == 0;
    INFO("case " << c << ": " << describe(sc) << (h2d ? ", fail an h2d" : ", fail a d2h"));
    // A clean run counts the copies, so the fault can be put at a random one of them.
    std::uint64_t copies = 0;
    {
      auto copy_of = sc.host;
      auto sc2 = sc;
      for (std::size_t b = 0; b < copy_of.size(); ++b) {
        sc2.plan.buffers[b].data = copy_of[b].data();
      }
      auto dev = fast_device();
      prefetch_scheduler sched(*dev, sc2.plan, sc2.options);
      std::vector<std::uint64_t> seen;
      drive(sched, sc.first_step, sc.runs, seen);
      sched.flush();
      const auto m = sched.metrics();
      copies = h2d ? m.h2d.transfers : m.d2h.transfers;
    }
    if (copies == 0) {
      continue;
    }
    const auto ref = expected(sc);
    auto dev = fast_device();
    const auto free_before = dev->memory_free_bytes();
    {
      prefetch_scheduler sched(*dev, sc.plan, sc.options);
      const auto k =
          static_cast<unsigned>(std::uniform_int_distribution<std::uint64_t>(1, copies)(gen));
      dev->fail_copy(h2d ? dev->h2d_stream() : dev->d2h_stream(), k);
      bool thrown = false;
      std::vector<std::uint64_t> seen;
      try {
        drive(sched, sc.first_step, sc.runs, seen);
        sched.flush();
      } catch (const device_error& e) {
        thrown = true;
        CHECK_THAT(e.what(), Catch::Contains("injected fault"));
        CHECK_THAT(e.what(), Catch::Contains("prefetch_scheduler"));
      }
      REQUIRE(thrown);
      ++injected;
      // Each tier copy is one of the versions the reference went through.
      for (std::size_t b = 0; b < sc.host.size(); ++b) {
        INFO("buffer " << b);
        const auto& v = ref.versions[b];
        CHECK(std::find(v.begin(), v.end(), sc.host[b]) != v.end());
      }
      CHECK(sched.metrics().failed_steps > 0);
      // Usable again: more runs from the recovered state match the reference from that state.
      reference after(sc.host);
      const auto more = sc.plan.steps.size() * 2;
      const auto iteration = drive(sched, 0, more, seen);
      after.apply(sc.plan, 0, more, iteration);
      sched.flush();
      CHECK((seen == after.seen));
      CHECK((sc.host == after.state));
    }
    CHECK(dev->memory_free_bytes() == free_before);  // nothing left in HBM
  }
  CHECK(injected > 5);
}

TEST_CASE(
    "destroying the scheduler mid-iteration writes back what was released and frees "
    "everything",
    "[scheduler]") {
  auto gen = test::rng(705);
  for (int c = 0; c < 12; ++c) {
    auto sc = random_scenario(gen);
    INFO("case " << c << ": " << describe(sc));
    const auto ref = expected(sc);
    auto dev = fast_device();
    const auto free_before = dev->memory_free_bytes();
    const auto locked_before = locked_kib();
    std::vector<std::uint64_t> seen;  // outlives the scheduler, whose work writes into it
    {
      prefetch_scheduler sched(*dev, sc.plan, sc.options);
      drive(sched, sc.first_step, sc.runs, seen);
      (void)sched.acquire((sc.first_step + sc.runs) % sc.plan.steps.size());  // left acquired
      if (!test::under_sanitizer) {
        CHECK(locked_kib() > locked_before);
      }
    }
    CHECK(dev->memory_free_bytes() == free_before);
    if (!test::under_sanitizer) {
      CHECK(locked_kib() == locked_before);
    }
    CHECK((sc.host == ref.state));
  }
}

TEST_CASE("resident buffers stay in HBM and are written back by flush", "[scheduler]") {
  auto gen = test::rng(706);
  auto hot = test::random_bytes(5000, gen);
  auto cold = test::random_bytes(7000, gen);
  schedule_plan p;
  const auto h = p.add_buffer({"hot", hot.data(), hot.size(), true, false});
  const auto c = p.add_buffer({"cold", cold.data(), cold.size(), false, false});
  p.add_step({"use", {c}, {h}});
  scheduler_options o;
  o.hbm_budget_bytes = 1 << 20;
  o.window = 0;  // otherwise the next run's prefetch keeps the cold buffer staged
  auto dev = fast_device();
  prefetch_scheduler sched(*dev, p, o);
  auto* dev_hot = static_cast<unsigned char*>(sched.resident_pointer(h));
  CHECK(std::equal(hot.begin(), hot.end(), dev_hot));  // uploaded at construction
  const auto original = hot;
  for (int i = 0; i < 3; ++i) {
    const auto& s = sched.acquire(0);
    CHECK(s.pointer(h) == dev_hot);
    s.compute().host_callback([dev_hot] {
      for (int j = 0; j < 5000; ++j) {
        dev_hot[j] = static_cast<unsigned char>(dev_hot[j] + 1);
      }
    });
    sched.release(0);
  }
  sched.flush();
  for (std::size_t j = 0; j < hot.size(); ++j) {
    REQUIRE(hot[j] == static_cast<unsigned char>(original[j] + 3));
  }
  const auto m = sched.metrics();
  CHECK(m.bytes_in == 3 * 7000);  // the resident buffer is not fetched per step
  CHECK(m.bytes_out == 0);        // nor written back per step
}

TEST_CASE("the trace is valid JSON with one track per stream and spans that do not overlap",
          "[scheduler][trace]") {
  auto gen = test::rng(707);
  auto sc = random_scenario(gen);
  sc.options.trace = true;
  INFO(describe(sc));
  auto dev = fast_device();
  prefetch_scheduler sched(*dev, sc.plan, sc.options);
  std::vector<std::uint64_t> seen;
  drive(sched, sc.first_step, sc.runs, seen);
  sched.flush();
  const auto m = sched.metrics();
  const auto doc = nlohmann::json::parse(sched.trace_json());
  std::map<int, std::string> tracks;
  std::map<std::string, std::vector<std::pair<double, double>>> spans;
  std::map<std::string, std::int64_t> bytes;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") {
      tracks[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    } else {
      REQUIRE(e.at("ph") == "X");
      const auto& track = tracks.at(e.at("tid").get<int>());
      const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
      CHECK(dur >= 0);
      spans[track].emplace_back(ts, ts + dur);
      if (track != "compute") {
        bytes[track] += e.at("args").at("bytes").get<std::int64_t>();
        CHECK(e.at("name").get<std::string>().rfind("buf", 0) == 0);
      }
    }
  }
  std::size_t compute_spans = 0;
  for (auto& [track, list] : spans) {
    INFO("track " << track);
    std::sort(list.begin(), list.end());
    for (std::size_t i = 1; i < list.size(); ++i) {
      CHECK(list[i].first >= list[i - 1].second - 1.0);  // 1 us of rounding
    }
  }
  for (const auto& e : doc.at("traceEvents")) {
    compute_spans += e.at("ph") == "X" && e.at("cat") == "compute" ? 1 : 0;
  }
  CHECK(compute_spans == sc.runs);
  CHECK(bytes["h2d"] == static_cast<std::int64_t>(m.bytes_in));
  CHECK(bytes["d2h"] == static_cast<std::int64_t>(m.bytes_out));
}

TEST_CASE("the JSON snapshot and the Prometheus text carry the documented names",
          "[scheduler][prometheus]") {
  auto gen = test::rng(708);
  auto sc = random_scenario(gen);
  auto dev = fast_device();
  prefetch_scheduler sched(*dev, sc.plan, sc.options);
  std::vector<std::uint64_t> seen;
  drive(sched, 0, sc.plan.steps.size() * 3, seen);
  sched.flush();
  const auto m = sched.metrics();
  const auto doc = nlohmann::json::parse(sched.snapshot_json());
  CHECK(doc.at("schema_version") == metrics::snapshot_schema_version);
  const auto& s = doc.at("scheduler");
  for (const char* key :
       {"step_time_s", "lower_bound_s", "overlap_efficiency", "stall_fraction", "bytes_in",
        "bytes_out", "bytes_discarded", "hbm_staging_peak_bytes", "window"}) {
    INFO(key);
    CHECK(s.contains(key));
  }
  CHECK(s.at("bytes_in") == m.bytes_in);
  CHECK(s.at("window") == m.window);
  CHECK(s.at("bytes_discarded") == m.bytes_discarded);
  CHECK(s.at("iterations") == 2);
  CHECK(s.at("per_step").size() == sc.plan.steps.size());
  CHECK(m.step_time_s > 0);
  CHECK(m.overlap_efficiency > 0);
  CHECK(m.overlap_efficiency <= 1.05);  // nothing beats the lower bound (by much: rounding)

  const auto text = sched.prometheus_text();
  CHECK(test::prometheus_format_problems(text).empty());
  CHECK_THAT(text, Catch::Contains("# TYPE tierflow_scheduler_bytes_in_total counter\n"));
  CHECK_THAT(text, Catch::Contains("tierflow_scheduler_bytes_in_total " +
                                   std::to_string(m.bytes_in) + "\n"));
  CHECK_THAT(text, Catch::Contains("tierflow_scheduler_step_stall_seconds_total{step=\"step0\"}"));
}

TEST_CASE("stalls, late prefetches and overlap are measured on the device", "[scheduler][timing]") {
  auto gen = test::rng(709);
  emulated_device_options o;
  o.link = link_model::parse("h2d=1GB/s,d2h=1GB/s,latency=0us", "test");
  o.copy_threads = 1;
  std::vector<std::vector<unsigned char>> host;
  schedule_plan p;
  for (int i = 0; i < 4; ++i) {
    host.push_back(test::random_bytes(1 << 20, gen));  // ~1.05 ms at 1 GB/s
    p.add_buffer({"b" + std::to_string(i), host.back().data(), host.back().size(), false, false});
    p.add_step({"s" + std::to_string(i), {static_cast<buffer_id>(i)}, {}});
  }
  const auto run = [&](std::uint64_t window, std::chrono::microseconds compute) {
    auto dev = emulated_device::create(o);
    scheduler_options so;
    so.hbm_budget_bytes = 8 << 20;
    so.window = window;
    prefetch_scheduler sched(*dev, p, so);
    for (int r = 0; r < 4 * 6; ++r) {
      const auto& s = sched.acquire(r % 4);
      s.compute().host_callback([compute] { std::this_thread::sleep_for(compute); });
      sched.release(r % 4);
    }
    sched.flush();
    return sched.metrics();
  };
  // No prefetch: every step waits for its whole transfer.
  const auto serial = run(0, std::chrono::microseconds(300));
  // (A slow host, e.g. under a sanitizer, may enqueue a step's compute after its copy landed:
  // ThreadSanitizer once left 2 of 24 on time, and more is possible on a loaded machine.)
  if (test::under_sanitizer) {
    CHECK(2 * serial.late_prefetches >= serial.steps);
  } else {
    CHECK(serial.late_prefetches + 2 >= serial.steps);
  }
  CHECK(serial.stall_fraction > 0.5);
  CHECK(serial.overlap_efficiency < 0.95);
  // Compute longer than a transfer and a window of 2: the link hides behind compute.
  const auto overlapped = run(2, std::chrono::microseconds(2000));
  if (!test::under_sanitizer) {
    CHECK(overlapped.stall_fraction < 0.1);
    CHECK(overlapped.late_prefetches <= 4);
    CHECK(overlapped.overlap_efficiency > 0.85);
  }
  CHECK(overlapped.overlap_efficiency <= 1.05);
  CHECK(overlapped.stall_fraction < serial.stall_fraction);
}

TEST_CASE("the adaptive window grows while compute stalls, within the budget",
          "[scheduler][timing]") {
  auto gen = test::rng(710);
  emulated_device_options o;
  o.link = link_model::parse("h2d=1GB/s,d2h=1GB/s,latency=0us", "test");
  o.copy_threads = 1;
  // Step 0 needs 3 MB (3 ms at 1 GB/s); steps 1-3 need little and compute 1.2 ms each: a
  // window of 1 stalls step 0 by ~1.8 ms, a window of 3 hides it.
  auto big = test::random_bytes(3'000'000, gen);
  std::vector<std::vector<unsigned char>> small;
  schedule_plan p;
  p.add_buffer({"big", big.data(), big.size(), false, false});
  p.add_step({"s0", {0}, {}});
  for (int i = 1; i < 4; ++i) {
    small.push_back(test::random_bytes(1024, gen));
    p.add_buffer({"small" + std::to_string(i), small.back().data(), 1024, false, false});
    p.add_step({"s" + std::to_string(i), {static_cast<buffer_id>(i)}, {}});
  }
  const auto run = [&](std::uint64_t budget, int iterations) {
    auto dev = emulated_device::create(o);
    scheduler_options so;
    so.hbm_budget_bytes = budget;
    so.adaptive = true;
    so.max_window = 8;
    prefetch_scheduler sched(*dev, p, so);
    for (int r = 0; r < 4 * iterations; ++r) {
      const auto& s = sched.acquire(r % 4);
      const auto us = r % 4 == 0 ? 500 : 1200;
      s.compute().host_callback(
          [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); });
      sched.release(r % 4);
    }
    sched.flush();
    return sched.metrics();
  };
  SECTION("room to grow") {
    const auto m = run(8 << 20, 24);
    CHECK(m.window >= 3);
    CHECK(m.window <= 8);
  }
  SECTION("a budget for one step at a time keeps it at 1") {
    // The host runs far ahead of the device here, so the decisions are made late: each run
    // must carry whether the budget held prefetches back while it ran.
    const auto m = run(3'000'064, 12);
    CHECK(m.window == 1);
    CHECK(m.stall_fraction > 0.1);
  }
}

TEST_CASE("staging arena: best fit, all or nothing, coalescing, fences", "[scheduler][arena]") {
  auto gen = test::rng(711);
  detail::staging_arena arena(1 << 16, 256);
  CHECK(arena.aligned(1) == 256);
  CHECK(arena.aligned(512) == 512);
  std::vector<std::uint64_t> offsets;
  detail::fence f;
  CHECK_FALSE(arena.allocate_all({1 << 15, 1 << 15, 1}, offsets, f));  // all or nothing
  CHECK(arena.used() == 0);
  // Random allocations and frees against a map of what is held: never an overlap.
  std::map<std::uint64_t, std::uint64_t> held;  // offset -> aligned size
  std::uint64_t last_compute_fence = 0;         // the fence of the latest free
  for (int i = 0; i < 2000; ++i) {
    if (held.empty() || gen() % 2 == 0) {
      const std::uint64_t n = gen() % 5000 + 1;
      detail::fence after;
      if (arena.allocate_all({n}, offsets, after)) {
        const auto size = arena.aligned(n);
        auto next = held.lower_bound(offsets[0]);
        CHECK((next == held.end() || next->first >= offsets[0] + size));
        if (next != held.begin()) {
          auto prev = std::prev(next);
          CHECK(prev->first + prev->second <= offsets[0]);
        }
        CHECK(offsets[0] % 256 == 0);
        CHECK(offsets[0] + size <= arena.capacity());
        held[offsets[0]] = size;
      }
    } else {
      auto it = std::next(held.begin(), static_cast<long>(gen() % held.size()));
      arena.free(it->first, it->second, {static_cast<std::uint64_t>(i), 0});
      last_compute_fence = static_cast<std::uint64_t>(i);
      held.erase(it);
    }
    std::uint64_t sum = 0;
    for (const auto& [o, s] : held) {
      sum += s;
    }
    REQUIRE(arena.used() == sum);
  }
  // The random walk may have left nothing held: hold one more range (if it does not fit, the
  // arena is full, so something is held anyway).
  if (arena.allocate_all({1}, offsets, f)) {
    held[offsets[0]] = arena.aligned(1);
  }
  REQUIRE_FALSE(held.empty());
  for (const auto& [o, s] : held) {
    arena.free(o, s, {5, 9});
  }
  CHECK(arena.free_ranges() == 1);  // everything coalesced
  detail::fence after;
  REQUIRE(arena.allocate_all({1 << 16}, offsets, after));
  // The merged fence of every range it was carved from: no later than the latest free, no
  // earlier than the final frees (a range freed in the walk may have been reused since).
  CHECK(after.compute <= std::max<std::uint64_t>(last_compute_fence, 5));
  CHECK(after.compute >= 5);
  CHECK(after.writeback == 9);
  // Merging exactly: two halves freed with different fences give their per-stream maximum.
  arena.free(0, 1 << 16, {3, 1});
  detail::fence halves;  // allocate_all merges into what it is given: start from nothing
  REQUIRE(arena.allocate_all({1 << 15, 1 << 15}, offsets, halves));
  CHECK((halves.compute == 3 && halves.writeback == 1));
  arena.free(offsets[0], 1 << 15, {50, 2});
  arena.free(offsets[1], 1 << 15, {40, 8});
  detail::fence whole;
  REQUIRE(arena.allocate_all({1 << 16}, offsets, whole));
  CHECK(whole.compute == 50);
  CHECK(whole.writeback == 8);
  CHECK_THROWS_AS(arena.free(1 << 20, 256, {}), error);
  arena.free(0, 1 << 16, {});
  CHECK_THROWS_AS(arena.free(0, 256, {}), error);  // already free
}
