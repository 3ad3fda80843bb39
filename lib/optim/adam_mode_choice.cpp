// offload_adam's choice of mode (adam_options::mode automatic): bytes per param over the link
// and through host memory, by the rates given, measured by tierflow bench, or measured now.
#include "optim/adam_mode_choice.hpp"

#include <algorithm>
#include <set>
#include <sstream>
#include <string>

namespace tierflow::detail {

void choose_mode(adam_core& core) {
  const adam_options& options = core.options;
  const auto& props = core.dev.properties();
  if (options.mode != adam_mode::automatic) {
    core.mode = options.mode;
    core.mode_reason = "asked for";
    return;
  }
  for (const auto& g : core.groups) {
    for (const auto& p : g.params) {
      if (p.state_dtype() != adam_state_dtype::f32) {
        core.mode = adam_mode::cpu;
        core.mode_reason = "param '" + p.desc.name + "' has " +
                           std::string(to_string(p.state_dtype())) +
                           " moments, which the cpu step runs";
        return;
      }
      if (p.desc.param_on_host) {
        core.mode = adam_mode::cpu;
        core.mode_reason = "param '" + p.desc.name + "' lives in host memory";
        return;
      }
      // A param in the caller's host memory (CPU tensors on the emulated device): streaming
      // its state through an emulated link to update it there only adds copies.
      if (!core.dev.is_device_memory(p.desc.param)) {
        core.mode = adam_mode::cpu;
        core.mode_reason = "param '" + p.desc.name + "' is host memory, not the device's";
        return;
      }
    }
  }
  // Bytes per param: cpu mode moves the grad down and the param up over the link and touches
  // 28 B in host memory (read p, g, m, v; write p, m, v); streamed mode moves the 12 B of
  // state each way and updates in HBM.
  double param_bytes = 0;
  for (const auto& g : core.groups) {
    for (const auto& p : g.params) {
      param_bytes += static_cast<double>(p.desc.elements * dtype_bytes(p.desc.dtype));
    }
  }
  const double per_param = param_bytes / static_cast<double>(core.total_elements);
  const double h2d = options.h2d_gbps > 0 ? options.h2d_gbps : props.h2d_gbps.value_or(25.0);
  const double d2h = options.d2h_gbps > 0 ? options.d2h_gbps : props.d2h_gbps.value_or(25.0);
  // Host memory rate: the caller's, else what tierflow bench measured for the nodes that hold
  // the state (read 16 B, write 12 B per param; the slowest node decides), else a quick copy.
  double host = options.host_memory_gbps;
  std::string host_source = "given";
  if (host <= 0) {
    const auto& topo = core.placement.machine();
    std::set<int> nodes;
    for (const auto& c : core.chunks) {
      nodes.insert(c.node);
    }
    double slowest = 0;
    for (const int n : nodes) {
      const auto perf = topo.access(topo.initiator(), numa_node_id{n});
      if (n < 0 || perf.read_bandwidth.source != attr_source::measured) {
        slowest = 0;
        break;
      }
      const double read = perf.read_bandwidth.value / 1000.0;  // MB/s -> GB/s
      const double write = perf.write_bandwidth.source == attr_source::measured
                               ? perf.write_bandwidth.value / 1000.0
                               : read;
      const double rate = 28.0 / (16.0 / read + 12.0 / write);
      slowest = slowest == 0 ? rate : std::min(slowest, rate);
    }
    host = slowest > 0 ? slowest : measure_host_bandwidth_gbps();
    host_source = slowest > 0 ? "measured by tierflow bench" : "a 32 MiB copy just now";
  }
  const double cpu_ns = per_param / d2h + std::max(28.0 / host, per_param / h2d);
  const double streamed_ns =
      props.full_duplex ? std::max(12.0 / h2d, 12.0 / d2h) : 12.0 / h2d + 12.0 / d2h;
  std::ostringstream why;
  why.precision(3);
  why << "cpu " << cpu_ns << " ns/param (grads " << per_param << " B down at " << d2h
      << " GB/s, then 28 B through host memory at " << host << " GB/s, " << host_source
      << ") vs streamed " << streamed_ns << " ns/param (12 B of state each way at " << h2d << "/"
      << d2h << " GB/s)";
  core.mode = cpu_ns <= streamed_ns ? adam_mode::cpu : adam_mode::streamed;
  core.mode_reason = why.str();
}

}  // namespace tierflow::detail
