// tierflow-adam-overlap-bench: the optimizer step behind the backward pass (issue 25).
// A training loop on the emulated device whose forward and backward passes are busy compute
// of known length on the caller's thread (a GPU's work, stood in for by a CPU core); the
// backward pass makes the params' grads final one by one, last layer first. Cases, alternated
// sample by sample in one run:
//   none            overlap none: step() after the backward pass does the whole Adam step
//   backward        overlap backward: grad_ready() after each param's grad; step() finishes
//   none+clip       as none, with a clip that fires every step (max_grad_norm tiny)
//   backward+clip   as backward with that clip: every speculative update is rolled back and
//                   redone in step() (the worst case)
// Exposed time = wall time of step() after the backward pass. The backward pass is sized to
// --backward-factor x the plain step's median (measured first), the forward to half of it.
// At the end the none and backward optimizers (and the two clipped ones) must hold the same
// bits: they saw the same grads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/bench_util.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;
using namespace tierflow::bench;
using json = nlohmann::ordered_json;

namespace {

clock_type::time_point after(clock_type::time_point start, double seconds) {
  return start +
         std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
}

// Busy compute until @p end (no sleep: it holds its core as a kernel launch loop would). The
// phases end at times fixed from the iteration's start, so that a thread descheduled on a
// loaded machine does not stretch the passes by its delays, one phase after another.
void busy_until(clock_type::time_point end) {
  double x = 1.0;
  while (clock_type::now() < end) {
    for (int i = 0; i < 256; ++i) {
      x = x * 1.0000001 + 1e-9;
    }
    keep(x);
  }
}

struct model {
  std::unique_ptr<device> dev;
  std::vector<void*> params;
  std::vector<void*> grads;
  std::size_t elements = 0;
  std::unique_ptr<offload_adam> opt;

  model(std::size_t layers, std::size_t n, std::uint64_t seed) : elements(n) {
    emulated_device_options eo;
    eo.link = link_model::parse("h2d=40GB/s,d2h=40GB/s,latency=1us", "adam-overlap-bench");
    eo.copy_threads = 1;
    eo.hbm_bytes = 2 * layers * n * sizeof(float) + (std::uint64_t{64} << 20);
    dev = emulated_device::create(eo);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::size_t l = 0; l < layers; ++l) {
      auto* p = static_cast<float*>(dev->memory().allocate(n * sizeof(float)));
      for (std::size_t i = 0; i < n; ++i) {
        p[i] = dist(gen);
      }
      params.push_back(p);
      grads.push_back(dev->memory().allocate(n * sizeof(float)));
    }
  }
  ~model() {
    opt.reset();
    for (std::size_t l = 0; l < params.size(); ++l) {
      dev->memory().deallocate(params[l], elements * sizeof(float));
      dev->memory().deallocate(grads[l], elements * sizeof(float));
    }
  }
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  void build(placement_policy& placement, adam_options options) {
    std::vector<adam_group> groups(1);
    groups[0].hyper.weight_decay = 0.01;
    for (std::size_t l = 0; l < params.size(); ++l) {
      groups[0].params.push_back(
          {"layer" + std::to_string(l) + ".w", params[l], grads[l], param_dtype::f32, elements});
    }
    opt = std::make_unique<offload_adam>(*dev, std::move(groups), options, placement);
  }
};

struct sample {
  double exposed = 0;
  double iteration = 0;
};

// One iteration: forward, then backward layer by layer (last first), each layer's grads
// final at its end and announced when @p announce; then step(). The grads are written into
// the device buffers before the clock starts (a GPU's backward writes them in HBM; the
// emulated device's "HBM" is host memory, and copying them in is no part of the model).
sample iterate(model& m, const std::vector<std::vector<float>>& grads, double forward_s,
               double backward_s, bool announce) {
  const std::size_t layers = m.params.size();
  for (std::size_t l = 0; l < layers; ++l) {
    std::memcpy(m.grads[l], grads[l].data(), m.elements * sizeof(float));
  }
  const auto start = clock_type::now();
  busy_until(after(start, forward_s));
  for (std::size_t k = 0; k < layers; ++k) {
    const std::size_t l = layers - 1 - k;
    const double layer_s = backward_s * static_cast<double>(k + 1) / static_cast<double>(layers);
    busy_until(after(start, forward_s + layer_s));
    if (announce) {
      m.opt->grad_ready(0, l);
    }
  }
  const auto step_start = clock_type::now();
  const auto r = m.opt->step();
  keep(r.grad_norm);
  return {seconds_since(step_start), seconds_since(start)};
}

json summary_ms(const std::vector<double>& v) {
  return summary_json(summarize(v), 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierflow-adam-overlap-bench: the Adam step behind the backward pass (issue 25)"};
  std::string params_text = "8M";
  std::size_t layers = 8;
  unsigned threads = 1;
  int samples = 10;
  double factor = 1.2;
  bool as_json = false;
  app.add_option("--params", params_text, "parameters in all (K, M suffixes)");
  app.add_option("--layers", layers, "layers (params announced one by one)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--threads", threads, "Adam worker threads")->check(CLI::Range(1, 256));
  app.add_option("--samples", samples, "iterations per case")->check(CLI::Range(3, 1000));
  app.add_option("--backward-factor", factor, "backward = factor x the plain step")
      ->check(CLI::Range(0.1, 100.0));
  app.add_flag("--json", as_json, "JSON output");
  CLI11_PARSE(app, argc, argv);
  const std::size_t n = std::max<std::size_t>(1, parse_count(params_text, "--params") / layers);

  const topology topo = topology::discover();
  placement_options po;
  po.reserve_bytes = 0;
  placement_policy placement(topo, po);
  adam_options base;
  base.mode = adam_mode::cpu;
  base.threads = threads;
  base.chunk_elements = std::size_t{1} << 18;
  struct variant {
    const char* name;
    bool overlap;
    bool clip;
    std::unique_ptr<model> m;
    std::vector<double> exposed, iteration;
  };
  std::vector<variant> cases;
  for (const auto& [name, overlap, clip] :
       std::vector<std::tuple<const char*, bool, bool>>{{"none", false, false},
                                                        {"backward", true, false},
                                                        {"none+clip", false, true},
                                                        {"backward+clip", true, true}}) {
    variant v{name, overlap, clip, std::make_unique<model>(layers, n, 7), {}, {}};
    adam_options o = base;
    o.overlap = overlap ? adam_overlap::backward : adam_overlap::none;
    o.max_grad_norm = clip ? 1e-3 : 0.0;
    v.m->build(placement, o);
    cases.push_back(std::move(v));
  }
  std::mt19937_64 gen(11);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  std::vector<std::vector<float>> grads(layers, std::vector<float>(n));
  const auto new_grads = [&] {
    for (auto& g : grads) {
      for (auto& x : g) {
        x = dist(gen);
      }
    }
  };
  // The plain step alone (no compute around it), after one warm-up step.
  std::vector<double> plain;
  for (int s = 0; s < 6; ++s) {
    new_grads();
    for (auto& v : cases) {
      const sample t = iterate(*v.m, grads, 0, 0, false);
      if (s > 0 && !v.overlap && !v.clip) {
        plain.push_back(t.exposed);
      }
    }
  }
  const double adam_s = summarize(plain).median;
  const double backward_s = factor * adam_s;
  const double forward_s = backward_s / 2;
  for (int s = 0; s < samples; ++s) {
    new_grads();
    for (std::size_t k = 0; k < cases.size(); ++k) {
      auto& v = cases[(k + static_cast<std::size_t>(s)) % cases.size()];  // rotate the order
      const sample t = iterate(*v.m, grads, forward_s, backward_s, v.overlap);
      v.exposed.push_back(t.exposed);
      v.iteration.push_back(t.iteration);
    }
  }
  const auto same = [&](std::size_t a, std::size_t b) {
    for (std::size_t l = 0; l < layers; ++l) {
      if (cases[a].m->opt->master_weights(0, l) != cases[b].m->opt->master_weights(0, l) ||
          cases[a].m->opt->exp_avg_sq(0, l) != cases[b].m->opt->exp_avg_sq(0, l)) {
        return false;
      }
    }
    return true;
  };
  const bool identical = same(0, 1) && same(2, 3);
  const double plain_exposed = summarize(cases[0].exposed).median;
  const double bound = std::max(forward_s + backward_s, adam_s);
  json out;
  out["params"] = n * layers;
  out["layers"] = layers;
  out["threads"] = threads;
  out["samples"] = samples;
  out["adam_step_ms"] = adam_s * 1e3;
  out["forward_ms"] = forward_s * 1e3;
  out["backward_ms"] = backward_s * 1e3;
  out["bound_ms"] = bound * 1e3;
  for (const auto& v : cases) {
    const double e = summarize(v.exposed).median;
    const double it = summarize(v.iteration).median;
    const adam_metrics am = v.m->opt->metrics();
    out["cases"][v.name] = {{"exposed_ms", summary_ms(v.exposed)},
                            {"iteration_ms", summary_ms(v.iteration)},
                            {"exposed_fraction", e / plain_exposed},
                            {"iteration_over_bound", it / bound},
                            {"rollbacks", am.rollbacks},
                            {"rollback_bytes", am.rollback_bytes}};
  }
  out["bit_identical"] = identical;
  if (as_json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf(
        "tierflow-adam-overlap-bench: %zu params in %zu layers, %u Adam thread(s), %d samples\n"
        "plain Adam step %.1f ms alone; forward %.1f ms + backward %.1f ms; bound max(fwd+bwd, "
        "step) %.1f ms\n",
        n * layers, layers, threads, samples, adam_s * 1e3, forward_s * 1e3, backward_s * 1e3,
        bound * 1e3);
    std::printf("%-14s %28s %10s %28s %10s %9s\n", "case", "exposed ms median [min, max]",
                "fraction", "iteration ms median [min,max]", "x bound", "rollbacks");
    for (const auto& v : cases) {
      const summary e = summarize(v.exposed);
      const summary it = summarize(v.iteration);
      std::printf("%-14s %10.2f [%6.2f, %6.2f] %10.3f %10.1f [%6.1f, %6.1f] %10.3f %9llu\n", v.name,
                  e.median * 1e3, e.min * 1e3, e.max * 1e3, e.median / plain_exposed,
                  it.median * 1e3, it.min * 1e3, it.max * 1e3, it.median / bound,
                  static_cast<unsigned long long>(v.m->opt->metrics().rollbacks));
    }
    std::printf("verify: none vs backward, none+clip vs backward+clip: %s\n",
                identical ? "bit-identical" : "DIFFERENT");
  }
  return identical ? 0 : 1;
}
