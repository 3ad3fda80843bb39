// The pipeline model (schedule_model.hpp) against the closed forms of its limiting cases:
// no prefetch is serial, a deep window is compute- or link-bound, a half-duplex link adds
// its two directions, a flushed iteration pays its first fetch.

#include <numeric>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/schedule_model.hpp"

using namespace tierflow;

namespace {

struct random_plan {
  schedule_plan plan;
  std::vector<double> compute;
  std::vector<double> fetch;  // seconds to fetch step i's buffer
  std::uint64_t largest = 0;  // bytes
  std::uint64_t total = 0;    // bytes
};

// n steps, each reading (and with @p writes, writing) its own buffer of random size (or of
// @p fixed_bytes).
random_plan make_plan(std::mt19937_64& gen, std::size_t n, const link_fit& h2d, double c_lo,
                      double c_hi, bool writes, std::uint64_t fixed_bytes = 0) {
  std::uniform_int_distribution<std::uint64_t> pages(256, 2048);  // 1 .. 8 MiB
  std::uniform_real_distribution<double> c(c_lo, c_hi);
  random_plan r;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t bytes = fixed_bytes != 0 ? fixed_bytes : pages(gen) * 4096;
    const auto id = r.plan.add_buffer({"b" + std::to_string(i), nullptr, bytes, false, false});
    step_desc st{"s" + std::to_string(i), {}, {}};
    (writes ? st.writes : st.reads).push_back(id);
    r.plan.add_step(st);
    r.compute.push_back(c(gen));
    r.fetch.push_back(h2d.seconds(bytes));
    r.largest = std::max(r.largest, bytes);
    r.total += bytes;
  }
  return r;
}

link_fit random_link(std::mt19937_64& gen) {
  std::uniform_real_distribution<double> gbps(2, 30);
  std::uniform_real_distribution<double> latency(0, 20e-6);
  return {gbps(gen), latency(gen)};
}

double sum(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0);
}

}  // namespace

TEST_CASE("model: window 0 is serial, fetch then compute", "[schedule][model]") {
  auto gen = test::rng(0x6d0de1);
  const link_fit link = random_link(gen);
  const auto r = make_plan(gen, 3 + gen() % 8, link, 1e-4, 5e-3, false);
  schedule_model_options o;
  o.window = 0;
  o.h2d = o.d2h = link;
  o.hbm_budget_bytes = r.total * 2;  // room to spare: the fence still serialises
  const auto p = predict_schedule(r.plan, r.compute, o);
  const double expected = sum(r.compute) + sum(r.fetch);
  CHECK(p.iteration_s == Approx(expected).epsilon(1e-9));
  CHECK(p.stall_s == Approx(sum(r.fetch)).epsilon(1e-9));
  CHECK(p.stall_fraction == Approx(sum(r.fetch) / expected).epsilon(1e-9));
  CHECK(p.bytes_in == r.total);
  CHECK(p.bytes_out == 0);
  CHECK(p.staging_peak_bytes == r.largest);
}

TEST_CASE("model: a deep window hides the link behind compute, or compute behind the link",
          "[schedule][model]") {
  auto gen = test::rng(0x6d0de2);
  const link_fit link = random_link(gen);
  const std::size_t n = 4 + gen() % 6;
  schedule_model_options o;
  o.h2d = o.d2h = link;
  // At most n - 2 steps ahead: with every step staged, nothing would ever be fetched again.
  o.window = 2 + gen() % (n - 3);
  SECTION("compute-bound: every compute longer than any fetch") {
    auto r = make_plan(gen, n, link, 0, 0, false);
    const double slowest = *std::max_element(r.fetch.begin(), r.fetch.end());
    std::uniform_real_distribution<double> c(1.1 * slowest, 3 * slowest);
    for (auto& v : r.compute) {
      v = c(gen);
    }
    o.hbm_budget_bytes = r.total;
    const auto p = predict_schedule(r.plan, r.compute, o);
    CHECK(p.iteration_s == Approx(sum(r.compute)).epsilon(1e-9));
    CHECK(p.stall_s == Approx(0).margin(1e-12));
    CHECK(p.lower_bound_s == Approx(sum(r.compute)).epsilon(1e-12));
  }
  SECTION("link-bound: compute negligible, so the fetches run back to back") {
    const auto r = make_plan(gen, n, link, 1e-9, 2e-9, false);
    o.hbm_budget_bytes = r.total;
    const auto p = predict_schedule(r.plan, r.compute, o);
    CHECK(p.iteration_s == Approx(sum(r.fetch)).epsilon(1e-6));
    CHECK(p.lower_bound_s ==
          Approx(static_cast<double>(r.total) / (link.gbps * 1e9)).epsilon(1e-12));
    CHECK(p.iteration_s >= p.lower_bound_s);
  }
}

TEST_CASE("model: write-backs share a half-duplex link and run beside fetches on a full one",
          "[schedule][model]") {
  auto gen = test::rng(0x6d0de3);
  link_fit link = random_link(gen);
  link.latency_s = 0;
  const auto r = make_plan(gen, 4 + gen() % 5, link, 1e-9, 2e-9, true);
  schedule_model_options o;
  o.h2d = o.d2h = link;
  o.window = 3;
  o.hbm_budget_bytes = 2 * r.total;
  o.iterations = 6;
  const double one_way = sum(r.fetch);
  const auto full = predict_schedule(r.plan, r.compute, o);
  CHECK(full.bytes_in == r.total);
  CHECK(full.bytes_out == r.total);
  o.full_duplex = false;
  const auto half = predict_schedule(r.plan, r.compute, o);
  // Each buffer goes in and comes back: one after the other on a half-duplex link...
  CHECK(half.iteration_s == Approx(2 * one_way).epsilon(1e-6));
  // ...side by side on a full one, where a fetch into a range still being written back
  // waits for that write-back.
  CHECK(full.iteration_s >= one_way * (1 - 1e-9));
  CHECK(full.iteration_s <= 0.75 * half.iteration_s);
  CHECK(half.lower_bound_s == Approx(2 * one_way).epsilon(1e-9));
}

TEST_CASE("model: a flushed iteration starts empty and pays its first fetch", "[schedule][model]") {
  auto gen = test::rng(0x6d0de4);
  const link_fit link = random_link(gen);
  auto r = make_plan(gen, 3 + gen() % 6, link, 0, 0, false);
  const double slowest = *std::max_element(r.fetch.begin(), r.fetch.end());
  for (auto& v : r.compute) {
    v = slowest * (1.2 + static_cast<double>(gen() % 100) / 100.0);
  }
  schedule_model_options o;
  o.h2d = o.d2h = link;
  o.window = 1;
  o.hbm_budget_bytes = 3 * r.largest;
  o.flush_each_iteration = true;
  const auto p = predict_schedule(r.plan, r.compute, o);
  CHECK(p.iteration_s == Approx(r.fetch[0] + sum(r.compute)).epsilon(1e-9));
  CHECK(p.stall_s == Approx(r.fetch[0]).epsilon(1e-9));
  // Without the flush, the window wraps and hides step 0's fetch too.
  o.flush_each_iteration = false;
  CHECK(predict_schedule(r.plan, r.compute, o).iteration_s == Approx(sum(r.compute)).epsilon(1e-9));
}

TEST_CASE("model: a budget of one step forces serial fetches whatever the window",
          "[schedule][model]") {
  auto gen = test::rng(0x6d0de5);
  const link_fit link = random_link(gen);
  const auto r = make_plan(gen, 5, link, 1e-4, 1e-3, false, (256 + gen() % 1024) * 4096);
  schedule_model_options o;
  o.h2d = o.d2h = link;
  o.window = 4;
  o.hbm_budget_bytes = r.largest;
  const auto p = predict_schedule(r.plan, r.compute, o);
  CHECK(p.iteration_s == Approx(sum(r.compute) + sum(r.fetch)).epsilon(1e-9));
  CHECK(p.staging_peak_bytes == r.largest);
  // And a wider budget is never slower.
  o.hbm_budget_bytes = 3 * r.largest;
  CHECK(predict_schedule(r.plan, r.compute, o).iteration_s <= p.iteration_s * (1 + 1e-12));
}

TEST_CASE("model: bad plans and options are refused", "[schedule][model]") {
  auto gen = test::rng(0x6d0de6);
  const link_fit link = random_link(gen);
  const auto r = make_plan(gen, 3, link, 1e-4, 1e-3, false);
  schedule_model_options o;
  o.h2d = o.d2h = link;
  o.hbm_budget_bytes = r.largest - 1;
  CHECK_THROWS_WITH(predict_schedule(r.plan, r.compute, o),
                    Catch::Contains("too small") && Catch::Contains("largest step"));
  o.hbm_budget_bytes = r.total;
  CHECK_THROWS_WITH(predict_schedule(r.plan, {1e-3}, o), Catch::Contains("1 compute times"));
  CHECK_THROWS_AS(predict_schedule(r.plan, {1e-3, -1, 1e-3}, o), error);
  o.iterations = 1;
  CHECK_THROWS_WITH(predict_schedule(r.plan, r.compute, o), Catch::Contains("2 iterations"));
  o.iterations = 4;
  o.h2d.gbps = 0;
  CHECK_THROWS_WITH(predict_schedule(r.plan, r.compute, o), Catch::Contains("bandwidth"));
  CHECK_THROWS_WITH(predict_schedule(schedule_plan{}, {}, o), Catch::Contains("no steps"));
}
