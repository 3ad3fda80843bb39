// A plan file as tune's workload (plan_workload.hpp).
#include "tune/plan_workload.hpp"

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "demo/demo_train.hpp"
#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow::cli::tune {

namespace {

using clock_type = std::chrono::steady_clock;

// Compute for @p seconds on the calling thread: sleep through most of it, spin the rest, so
// that the step takes what the plan says and no less.
void compute_for(double seconds) {
  const auto end = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                           std::chrono::duration<double>(seconds));
  constexpr auto spin = std::chrono::microseconds(300);
  if (const auto left = end - clock_type::now(); left > 2 * spin) {
    std::this_thread::sleep_for(left - spin);
  }
  while (clock_type::now() < end) {
  }
}

}  // namespace

std::uint64_t plan_staging_budget(const tune_plan& tp, std::uint64_t window) {
  std::uint64_t resident = 0;
  std::uint64_t staged_total = 0;
  for (const auto& b : tp.plan.buffers) {
    (b.resident ? resident : staged_total) += b.bytes;
  }
  std::uint64_t largest_step = 0;
  for (const auto& s : tp.plan.steps) {
    std::uint64_t bytes = 0;
    for (const auto* list : {&s.reads, &s.writes}) {
      for (buffer_id id : *list) {
        bytes += tp.plan.buffers[id].resident ? 0 : tp.plan.buffers[id].bytes;
      }
    }
    largest_step = std::max(largest_step, bytes);
  }
  // Room for the window plus the step running and the one being released, never more than
  // every staged buffer at once beside the largest step; alignment slack per buffer.
  const std::uint64_t staging = std::min((window + 2) * largest_step, staged_total + largest_step);
  return resident + staging + 2 * 256 * (tp.plan.buffers.size() + 4);
}

plan_workload::plan_workload(tune_plan parsed, const topology& topo, const demo::demo_options& o)
    : tp(std::move(parsed)), placement(topo, demo::demo_placement_options(o)) {
  std::mt19937_64 gen(std::random_device{}());
  for (auto& b : tp.plan.buffers) {
    host.push_back(placement.allocate(data_class::params, b.bytes));
    auto* words = static_cast<std::uint64_t*>(host.back().data());
    auto* bytes = static_cast<unsigned char*>(host.back().data());
    for (std::size_t i = 0; i < b.bytes / 8; ++i) {
      words[i] = gen();
    }
    for (std::size_t i = b.bytes / 8 * 8; i < b.bytes; ++i) {
      bytes[i] = static_cast<unsigned char>(gen());
    }
    b.data = host.back().data();
  }
}

tune_point run_plan(plan_workload& w, device& dev, std::uint64_t window, std::size_t warmup,
                    std::size_t measured) {
  // Declared before the scheduler: its destructor waits for the callbacks that write it.
  std::vector<clock_type::time_point> starts;
  const std::size_t iterations = warmup + measured + 1;
  starts.reserve(iterations);
  scheduler_options so;
  so.window = window;
  so.hbm_budget_bytes = plan_staging_budget(w.tp, window);
  prefetch_scheduler sched(dev, w.tp.plan, so);
  const auto& steps = w.tp.plan.steps;
  for (std::size_t it = 0; it < iterations; ++it) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const staged_step& st = sched.acquire(i);
      const double seconds = w.tp.compute_s[i];
      const bool first = i == 0;
      st.compute().host_callback([&starts, seconds, first] {
        if (first) {
          starts.push_back(clock_type::now());
        }
        compute_for(seconds);
      });
      sched.release(i, !steps[i].writes.empty());
    }
  }
  dev.compute_stream().synchronize();
  sched.flush();
  std::vector<double> iteration_s;
  for (std::size_t k = 1; k < starts.size(); ++k) {
    iteration_s.push_back(std::chrono::duration<double>(starts[k] - starts[k - 1]).count());
  }
  const auto m = sched.metrics();
  tune_point p;
  p.window = window;
  p.mode = "none";
  p.step_s = median_after(iteration_s, warmup);
  p.stall = m.stall_fraction;
  p.hbm = m.hbm_staging_peak_bytes;
  return p;
}

double probe_step_overhead(device& dev, const topology& topo, const demo::demo_options& o) {
  constexpr std::size_t steps = 8;
  tune_plan tp;
  for (std::size_t i = 0; i < steps; ++i) {
    tp.plan.add_buffer({"probe" + std::to_string(i), nullptr, 4096, false, false});
    tp.plan.add_step({"probe" + std::to_string(i), {static_cast<buffer_id>(i)}, {}});
    tp.compute_s.push_back(0.0);
    tp.total_bytes += 4096;
  }
  plan_workload w(std::move(tp), topo, o);
  const tune_point p = run_plan(w, dev, 2, 3, 15);
  return p.step_s / steps;
}

}  // namespace tierflow::cli::tune
