// The topology as JSON: one document for `tierflow topo --json`, the C ABI (tf_topology_json)
// and the Python package (tierflow.distributed), so none re-derives it.
#include <cstdint>
#include <string>
#include <vector>

#include "tierflow/detail/parse.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/topology.hpp"

namespace tierflow {

namespace {

using metrics::json_writer;

void ids(json_writer& w, const std::vector<numa_node_id>& nodes) {
  w.begin_array();
  for (const auto& id : nodes) {
    w.value(id.value);
  }
  w.end_array();
}

void perf(json_writer& w, const char* name, const perf_value& value) {
  w.key(name).begin_object().key("value");
  if (value.known()) {
    w.value(value.value);
  } else {
    w.null();
  }
  w.key("source").value(to_string(value.source)).end_object();
}

void access(json_writer& w, const access_perf& p) {
  perf(w, "read_bandwidth_mbps", p.read_bandwidth);
  perf(w, "write_bandwidth_mbps", p.write_bandwidth);
  perf(w, "read_latency_ns", p.read_latency);
  perf(w, "write_latency_ns", p.write_latency);
}

void optional_bytes(json_writer& w, const std::optional<std::uint64_t>& value) {
  if (value) {
    w.value(*value);
  } else {
    w.null();
  }
}

void text_or_null(json_writer& w, const std::string& text) {
  if (text.empty()) {
    w.null();
  } else {
    w.value(text);
  }
}

void tiers(json_writer& w, const topology& topo) {
  w.key("tiers").begin_array();
  for (const auto& t : topo.tiers()) {
    w.begin_object().key("name").value(t.name).key("kind").value(to_string(t.kind));
    w.key("nodes");
    ids(w, t.nodes);
    w.key("gpu");
    if (t.gpu >= 0) {
      w.value(t.gpu);
    } else {
      w.null();
    }
    w.key("capacity_bytes").value(t.capacity_bytes).key("free_bytes");
    optional_bytes(w, t.free_bytes);
    w.key("perf").begin_object();
    access(w, t.perf);
    w.end_object().key("nearest_gpus").begin_array();
    for (const int g : t.nearest_gpus) {
      w.value(g);
    }
    w.end_array().end_object();
  }
  w.end_array();
}

void nodes(json_writer& w, const topology& topo) {
  w.key("nodes").begin_array();
  for (const auto& n : topo.nodes()) {
    w.begin_object().key("id").value(n.id.value).key("has_cpu").value(n.has_cpu);
    w.key("cpus").value(detail::format_id_list(n.cpus));
    w.key("capacity_bytes").value(n.capacity_bytes).key("free_bytes");
    optional_bytes(w, n.free_bytes);
    w.key("memory_tier");
    if (n.memory_tier) {
      w.value(*n.memory_tier);
    } else {
      w.null();
    }
    w.key("hwloc_subtype");
    text_or_null(w, n.hwloc_subtype);
    w.key("dax_device");
    text_or_null(w, n.dax_device);
    w.key("kind").value(to_string(n.kind)).key("kind_reason").value(n.kind_reason);
    w.key("distances").begin_object();
    for (const auto& other : topo.nodes()) {
      if (const auto d = topo.distance(n.id, other.id)) {
        w.key(std::to_string(other.id.value)).value(std::uint64_t{*d});
      }
    }
    w.end_object().end_object();
  }
  w.end_array();
}

void accesses(json_writer& w, const topology& topo) {
  w.key("access").begin_array();
  for (const auto& initiator : topo.nodes()) {
    for (const auto& target : topo.nodes()) {
      const auto p = topo.access(initiator.id, target.id);
      if (p.read_bandwidth.known() || p.write_bandwidth.known() || p.read_latency.known() ||
          p.write_latency.known()) {
        w.begin_object();
        access(w, p);
        w.key("initiator").value(initiator.id.value).key("target").value(target.id.value);
        w.end_object();
      }
    }
  }
  w.end_array();
}

void gpus(json_writer& w, const topology& topo) {
  w.key("gpus").begin_array();
  for (std::size_t i = 0; i < topo.gpus().size(); ++i) {
    const auto& g = topo.gpus()[i];
    w.begin_object().key("index").value(std::uint64_t{i}).key("cuda_index");
    if (g.cuda_index >= 0) {
      w.value(g.cuda_index);
    } else {
      w.null();
    }
    w.key("name");
    text_or_null(w, g.name);
    w.key("pci_bus_id").value(g.pci_bus_id).key("memory_total_bytes");
    optional_bytes(w,
                   g.memory_total_bytes > 0 ? std::optional(g.memory_total_bytes) : std::nullopt);
    w.key("memory_free_bytes");
    optional_bytes(w, g.memory_free_bytes > 0 ? std::optional(g.memory_free_bytes) : std::nullopt);
    w.key("nearest_nodes");
    ids(w, g.nearest_nodes);
    w.end_object();
  }
  w.end_array();
}

}  // namespace

std::string to_json(const topology& topo) {
  json_writer w;
  w.begin_object().key("schema_version").value(topology_json_schema_version);
  w.key("sources").begin_array();
  for (const auto& s : topo.sources()) {
    w.value(s);
  }
  w.end_array().key("initiator").value(topo.initiator().value).key("tiers_override");
  text_or_null(w, topo.override_origin());
  w.key("gpu_status").value(topo.gpu_status());
  tiers(w, topo);
  nodes(w, topo);
  accesses(w, topo);
  gpus(w, topo);
  return w.end_object().str();
}

}  // namespace tierflow
