// tierflow-scheduler-bench: the prefetch scheduler's performance targets, each beside its bound.
//   overlap    emulated link capped at 4 GB/s each way, every step fetching and writing back
//              one buffer, compute per step = its transfer time: iteration time vs the lower
//              bound max(Σ compute, Σ in / bw_in, Σ out / bw_out), per window.
//              target: <= 1.10 x the bound at the best window (goal 1.05), stall <= 5 %
//   overhead   host CPU time of acquire + release per buffer per step, with copies and compute
//              that cost nothing (tiny buffers, an uncapped link, no work).  target: <= 3 us
// GB/s = 10^9 bytes per second.

#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <time.h>

#include "common/bench_util.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/prefetch_scheduler.hpp"

using namespace tierflow;
using namespace tierflow::bench;
using json = nlohmann::ordered_json;

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Buffers of @p bytes each, one per step (read and written when @p write).
struct plan_fixture {
  std::vector<std::vector<unsigned char>> host;
  schedule_plan plan;
  plan_fixture(std::size_t steps, std::size_t buffers_per_step, std::size_t bytes, bool write) {
    for (std::size_t s = 0; s < steps; ++s) {
      step_desc st{"step" + std::to_string(s), {}, {}};
      for (std::size_t b = 0; b < buffers_per_step; ++b) {
        host.emplace_back(bytes, static_cast<unsigned char>(s + b + 1));
        const auto id = plan.add_buffer({"buf" + std::to_string(s) + "." + std::to_string(b),
                                         host.back().data(), bytes, false, false});
        (write ? st.writes : st.reads).push_back(id);
      }
      plan.add_step(st);
    }
  }
};

json bench_overlap(int samples, std::size_t buffer_mib, int iterations) {
  constexpr double gbps = 4.0;
  constexpr std::size_t steps = 8;
  const std::size_t bytes = buffer_mib << 20;
  const auto compute = std::chrono::nanoseconds(
      static_cast<std::int64_t>(static_cast<double>(bytes) / gbps));  // bytes / (B/ns)
  plan_fixture fx(steps, 1, bytes, true);
  emulated_device_options dev_options;
  dev_options.link = link_model::parse("h2d=4GB/s,d2h=4GB/s,latency=10us", "bench");
  json rows = json::array();
  double best_ratio = 0, best_stall = 0;
  std::uint64_t best_window = 0;
  for (const std::uint64_t window : {0u, 1u, 2u, 3u, 4u}) {
    std::vector<double> step_s, bound_s, ratio, stall;
    for (int sample = 0; sample < samples; ++sample) {
      auto dev = emulated_device::create(dev_options);
      scheduler_options o;
      o.hbm_budget_bytes = (window + 2) * bytes;
      o.window = window;
      prefetch_scheduler sched(*dev, fx.plan, o);
      for (std::size_t r = 0; r < steps * static_cast<std::size_t>(iterations); ++r) {
        const auto& s = sched.acquire(r % steps);
        s.compute().host_callback([compute] { std::this_thread::sleep_for(compute); });
        sched.release(r % steps);
      }
      sched.flush();
      const auto m = sched.metrics();
      step_s.push_back(m.step_time_s);
      bound_s.push_back(m.lower_bound_s);
      ratio.push_back(m.step_time_s / m.lower_bound_s);
      stall.push_back(m.stall_fraction);
    }
    const auto r = summarize(ratio);
    if (best_ratio == 0 || r.median < best_ratio) {
      best_ratio = r.median;
      best_stall = summarize(stall).median;
      best_window = window;
    }
    rows.push_back({{"window", window},
                    {"step_time_ms", summary_json(summarize(step_s), 1e3)},
                    {"lower_bound_ms", summary_json(summarize(bound_s), 1e3)},
                    {"ratio_to_bound", summary_json(r)},
                    {"stall_fraction", summary_json(summarize(stall))}});
  }
  return {{"case", "overlap"},
          {"link", dev_options.link.describe()},
          {"steps", steps},
          {"buffer_mib", buffer_mib},
          {"iterations_per_sample", iterations},
          {"windows", rows},
          {"best",
           {{"window", best_window},
            {"ratio_to_bound", best_ratio},
            {"stall_fraction", best_stall},
            {"met", best_ratio <= 1.10 && best_stall <= 0.05}}}};
}

json bench_overhead(int samples) {
  constexpr std::size_t steps = 16, per_step = 4, runs = 4000;
  plan_fixture fx(steps, per_step, 64, true);
  emulated_device_options dev_options;
  dev_options.link = link_model::parse("h2d=100000GB/s,d2h=100000GB/s,latency=0ns", "bench");
  dev_options.copy_threads = 1;
  std::vector<double> cpu_us, wall_us;
  for (int sample = 0; sample < samples; ++sample) {
    auto dev = emulated_device::create(dev_options);
    scheduler_options o;
    o.hbm_budget_bytes = 1 << 20;
    o.window = 4;
    prefetch_scheduler sched(*dev, fx.plan, o);
    const auto wall = clock_type::now();
    const double cpu = thread_cpu_seconds();
    for (std::size_t r = 0; r < runs; ++r) {
      (void)sched.acquire(r % steps);
      sched.release(r % steps);
    }
    const double per = static_cast<double>(runs * per_step);
    cpu_us.push_back((thread_cpu_seconds() - cpu) / per * 1e6);
    wall_us.push_back(seconds_since(wall) / per * 1e6);
    sched.flush();
  }
  const auto cpu = summarize(cpu_us);
  return {{"case", "overhead"},
          {"steps", steps},
          {"buffers_per_step", per_step},
          {"runs_per_sample", runs},
          {"cpu_us_per_buffer_step", summary_json(cpu)},
          {"wall_us_per_buffer_step", summary_json(summarize(wall_us))},
          {"met", cpu.median <= 3.0}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierflow-scheduler-bench: prefetch scheduler benchmarks (GB/s = 10^9 B/s)"};
  int samples = 5;
  std::size_t buffer_mib = 8;
  int iterations = 8;
  app.add_option("--samples", samples, "Samples per case")->check(CLI::Range(1, 1000));
  app.add_option("--buffer-mib", buffer_mib, "Bytes per step's buffer in the overlap case, MiB")
      ->check(CLI::Range(1, 1024));
  app.add_option("--iterations", iterations, "Plan iterations per overlap sample (>= 2)")
      ->check(CLI::Range(2, 10000));
  CLI11_PARSE(app, argc, argv);
  try {
    json results = json::array();
    results.push_back(bench_overhead(samples));
    results.push_back(bench_overlap(samples, buffer_mib, iterations));
    const json doc{{"benchmark", "tierflow-scheduler-bench"}, {"results", results}};
    std::cout << doc.dump(2) << '\n';
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierflow-scheduler-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
