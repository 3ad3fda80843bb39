#include "bench/bench_run.hpp"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <memory>
#include <thread>

#include <sys/utsname.h>
#include <unistd.h>

#include "bench/case_registry.hpp"
#include "bench/stream_kernels.hpp"
#include "tierflow/build_config.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/device.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli {

using json = nlohmann::ordered_json;

bool case_selected(const std::string& name, const std::vector<std::string>& patterns) {
  if (patterns.empty()) {
    return true;
  }
  // A case's own name selects that case alone (h2d_pinned, not h2d_pinned_chunks); anything
  // else selects the cases it begins.
  const auto is_case = [](const std::string& p) {
    return std::any_of(bench_cases().begin(), bench_cases().end(),
                       [&](const bench_case& c) { return c.name == p; });
  };
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
    return name == p || (!is_case(p) && name.rfind(p, 0) == 0);
  });
}

std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  for (int index = 0; index < 16; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(in >> text) || text.empty()) {
      break;
    }
    std::size_t value = 0;
    std::size_t pos = 0;
    try {
      value = std::stoull(text, &pos);
    } catch (const std::exception&) {
      continue;
    }
    const std::string unit = text.substr(pos);
    value *= unit == "K" ? 1024 : unit == "M" ? 1024 * 1024 : 1;
    best = std::max(best, value);
  }
  return best ? best : std::size_t{32} << 20;
}

namespace {

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const auto open = line.find('[');
  const auto close = line.find(']');
  return open != std::string::npos && close > open ? line.substr(open + 1, close - open - 1)
                                                   : "unavailable";
}

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  }
  return "";
}

json machine_json(const topology& topo, std::size_t llc) {
  utsname u{};
  ::uname(&u);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  json nodes = json::array();
  for (const auto& n : topo.nodes()) {
    std::string tier_name;
    for (const auto& t : topo.tiers()) {
      if (std::find(t.nodes.begin(), t.nodes.end(), n.id) != t.nodes.end()) {
        tier_name = t.name;
      }
    }
    nodes.push_back({{"id", n.id.value},
                     {"has_cpu", n.has_cpu},
                     {"cpus", n.cpus.size()},
                     {"capacity_bytes", n.capacity_bytes},
                     {"kind", std::string(to_string(n.kind))},
                     {"tier", tier_name}});
  }
  return json{{"hostname", host},
              {"kernel", u.release},
              {"cpu_model", read_cpu_model()},
              {"cpus", std::thread::hardware_concurrency()},
              {"llc_bytes", llc},
              {"isa", std::string(stream_isa())},
              {"transparent_huge_pages", thp_mode()},
              {"nodes", nodes}};
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

void check_case_patterns(const std::vector<std::string>& patterns) {
  for (const auto& pattern : patterns) {
    // An empty name is a prefix of every case: it used to select them all.
    if (detail::trim(pattern).empty()) {
      throw input_error("--case",
                        "an empty case name selects nothing (leave --case out for every case)",
                        pattern);
    }
    const bool any =
        std::any_of(bench_cases().begin(), bench_cases().end(),
                    [&](const bench_case& c) { return case_selected(c.name, {pattern}); });
    if (!any) {
      throw input_error("--case", "no case is named so or starts so (see tierflow bench --list)",
                        pattern);
    }
  }
}

namespace {

std::vector<const numa_node*> initiators(const topology& topo) {
  std::vector<const numa_node*> out;
  for (const auto& n : topo.nodes()) {
    if (n.has_cpu && !n.cpus.empty()) {
      out.push_back(&n);
    }
  }
  return out;
}

// The selected cases of @p group, in its order.
std::vector<const registered_case*> selected_cases(const case_group& group,
                                                   const bench_config& config) {
  std::vector<const registered_case*> out;
  for (const auto& c : group.cases) {
    if (case_selected(c.info.name, config.cases)) {
      out.push_back(&c);
    }
  }
  return out;
}

// Every site of @p group, as (initiator, target).
std::vector<std::pair<const numa_node*, const numa_node*>> sites_of(
    const case_group& group, const topology& topo, const std::vector<const numa_node*>& from) {
  std::vector<std::pair<const numa_node*, const numa_node*>> sites;
  for (const auto* initiator : from) {
    for (const auto& to : topo.nodes()) {
      sites.emplace_back(initiator, &to);
    }
    if (group.site == case_site::first_initiator) {
      break;
    }
  }
  return sites;
}

// Checks the config and opens the device when a selected case needs one: a bad --device spec
// or TIERFLOW_EMU_LINK is an input error now, not after minutes of node cases.
void prepare(run_context& ctx) {
  const auto& config = ctx.config;
  check_case_patterns(config.cases);
  bool device = false;
  for (const auto& group : case_groups()) {
    for (const auto* c : selected_cases(group, config)) {
      device = device || c->need == case_need::device;
    }
  }
  if (device) {
    try {
      ctx.dev = open_device(config.device);
    } catch (const input_error&) {
      throw;
    } catch (const std::exception& e) {
      ctx.no_device = e.what();
    }
  }
  if (config.samples < 1) {
    throw input_error("--samples", "must be at least 1", std::to_string(config.samples));
  }
}

// Runs every group at each of its sites: the node-pair groups interleaved pair by pair, then
// the others group by group. A case whose need the machine lacks is waived once, with why.
void run_groups(run_context& ctx, const std::vector<const numa_node*>& from) {
  const auto runnable = [&](const case_group& group) {
    auto selected = selected_cases(group, ctx.config);
    std::erase_if(selected, [&](const registered_case* c) {
      if (c->need == case_need::device && !ctx.dev) {
        ctx.testcases.push_back(waived(c->info.name, "no device: " + ctx.no_device));
        return true;
      }
      return false;
    });
    return selected;
  };
  std::vector<std::vector<const registered_case*>> pair_cases;
  for (const auto& group : case_groups()) {
    pair_cases.push_back(group.site == case_site::every_pair
                             ? runnable(group)
                             : std::vector<const registered_case*>{});
  }
  for (const auto* initiator : from) {
    for (const auto& to : ctx.topo.nodes()) {
      for (std::size_t g = 0; g < case_groups().size(); ++g) {
        if (!pair_cases[g].empty()) {
          case_groups()[g].run_site(ctx, *initiator, to, pair_cases[g]);
        }
      }
    }
  }
  for (const auto& group : case_groups()) {
    if (group.site == case_site::every_pair) {
      continue;
    }
    const auto selected = runnable(group);
    for (const auto& [initiator, to] : sites_of(group, ctx.topo, from)) {
      if (!selected.empty()) {
        group.run_site(ctx, *initiator, *to, selected);
      }
    }
  }
}
// The --state-dtype list as names.
json state_dtype_names(const std::vector<adam_state_dtype>& dtypes) {
  json out = json::array();
  for (const auto d : dtypes) {
    out.push_back(std::string(to_string(d)));
  }
  return out;
}

}  // namespace

json run_bench(const bench_config& config, const topology& topo, const bench_progress& progress) {
  run_context ctx{config, topo, progress};
  prepare(ctx);
  const auto from_nodes = initiators(topo);
  if (from_nodes.empty()) {
    throw error("bench: no NUMA node with CPUs was found");
  }
  const std::size_t llc = config.llc_bytes ? config.llc_bytes : last_level_cache_bytes();
  ctx.array_bytes = config.buffer_bytes ? config.buffer_bytes : 4 * llc;
  ctx.latency_bytes = config.buffer_bytes ? config.buffer_bytes : 8 * llc;
  for (const auto& group : case_groups()) {  // what will be measured, for the progress bar
    for (const auto* c : selected_cases(group, config)) {
      for (const auto& [from, to] : sites_of(group, topo, from_nodes)) {
        ctx.planned += c->measurements(config, *from);
      }
    }
  }
  for (const unsigned t : config.threads) {
    if (t == 0) {
      throw input_error("--threads", "thread counts must be at least 1", "0");
    }
  }
  run_groups(ctx, from_nodes);

  json machine = machine_json(topo, llc);
  machine["device"] = ctx.device;
  if (from_nodes.size() < 2) {
    machine["note"] = "one NUMA node with CPUs: the matrix has one initiator row";
  }
  json settings{{"samples", config.samples},
                {"warmup", 1},
                {"buffer_bytes", ctx.array_bytes},
                {"latency_buffer_bytes", ctx.latency_bytes},
                {"link_bytes", config.link_bytes},
                {"device", config.device},
                {"huge_pages", config.huge_pages},
                {"adam_layout", config.adam_aliased ? "aliased" : "staggered"},
                {"state_dtypes", state_dtype_names(config.state_dtypes)},
                {"llc_bytes_from", config.llc_bytes ? "--llc-mib" : "sysfs (cpu0 caches)"}};
  if (ctx.array_bytes < 4 * llc) {
    settings["note"] = "buffers are below 4 x the last-level cache: cache bandwidth is measured";
  }
  return json{
      {"tierflow_version", TIERFLOW_VERSION_STRING},
      {"date", utc_now()},
      {"units", {{"bandwidth", "GB/s (10^9 B/s)"}, {"size", "MiB (2^20 B)"}, {"latency", "ns"}}},
      {"machine", machine},
      {"settings", settings},
      {"testcases", ctx.testcases}};
}

}  // namespace tierflow::cli
