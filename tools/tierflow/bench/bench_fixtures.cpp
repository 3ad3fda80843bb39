#include "bench/bench_fixtures.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <sched.h>
#include <sys/mman.h>

namespace tierflow::cli {

using json = nlohmann::ordered_json;

void run_context::step(const std::string& label) {
  ++done;
  if (progress) {
    progress(done, planned, label);
  }
}

pinned_team::pinned_team(const std::vector<int>& cpus, unsigned count)
    : start_(count + 1), end_(count + 1), begins_(count), ends_(count) {
  try {
    start(cpus, count);
  } catch (...) {  // e.g. EAGAIN: the threads that started leave, then the error goes on
    for (auto k = threads_.size(); k < count; ++k) {
      start_.arrive_and_drop();  // the missing ones no longer count
      end_.arrive_and_drop();
    }
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& th : threads_) {
      th.join();
    }
    throw;
  }
}

pinned_team::~pinned_team() {
  stop_ = true;
  start_.arrive_and_wait();
  for (auto& th : threads_) {
    th.join();
  }
}

double pinned_team::run(std::function<void(unsigned)> job) {
  job_ = std::move(job);
  start_.arrive_and_wait();
  end_.arrive_and_wait();
  const auto first = *std::min_element(begins_.begin(), begins_.end());
  const auto last = *std::max_element(ends_.begin(), ends_.end());
  return std::chrono::duration<double>(last - first).count();
}

void pinned_team::start(const std::vector<int>& cpus, unsigned count) {
  for (unsigned t = 0; t < count; ++t) {
    const int cpu = cpus[t % cpus.size()];
    threads_.emplace_back([this, t, cpu] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      ::sched_setaffinity(0, sizeof set, &set);  // best effort: a cgroup may forbid it
      for (;;) {
        start_.arrive_and_wait();
        if (stop_) {
          return;
        }
        begins_[t] = bench::clock_type::now();
        job_(t);
        ends_[t] = bench::clock_type::now();
        end_.arrive_and_wait();
      }
    });
  }
}

std::pair<std::size_t, std::size_t> part(std::size_t n, unsigned t, unsigned threads) {
  const std::size_t blocks = n / 16;
  const std::size_t begin = blocks * t / threads * 16;
  const std::size_t end = blocks * (t + 1) / threads * 16;
  return {begin, end};
}

json testcase(const std::string& name, const std::string& group, const char* unit,
              const std::vector<double>& values) {
  json tc{{"name", name}, {"group", group}, {"status", "ok"}, {"unit", unit}};
  tc.update(bench::summary_json(bench::summarize(values)));
  return tc;
}

json waived(const std::string& name, const std::string& reason, int initiator, int target) {
  std::string group;
  for (const auto& c : bench_cases()) {
    if (c.name == name) {
      group = c.group;
    }
  }
  json w{{"name", name}, {"group", group}, {"status", "waived"}, {"reason", reason}};
  if (initiator >= 0) {
    w["initiator"] = initiator;
  }
  if (target >= 0) {
    w["target"] = target;
  }
  return w;
}

bool fits(const numa_node& node, std::size_t need) {
  return !node.free_bytes || *node.free_bytes > need + (std::size_t{64} << 20);
}

std::vector<unsigned> thread_counts(const bench_config& config, std::size_t cpus) {
  if (!config.threads.empty()) {
    return config.threads;
  }
  std::vector<unsigned> counts;
  for (unsigned t = 1; t < cpus; t *= 2) {
    counts.push_back(t);
  }
  counts.push_back(static_cast<unsigned>(cpus));
  return counts;
}

std::string short_of_memory(const numa_node& node, int count, std::size_t bytes) {
  return "node " + std::to_string(node.id.value) + " has too little free memory for " +
         (count > 1 ? std::to_string(count) + " x " : "") + std::to_string(bytes / mib) + " MiB";
}

namespace {

numa_resource_options buffer_options(int node, bool huge) {
  numa_resource_options o;
  o.nodes = {numa_node_id{node}};
  o.huge_pages = huge;
  return o;
}

}  // namespace

node_buffer::node_buffer(int node, std::size_t bytes, bool huge)
    : resource_(buffer_options(node, huge)), bytes_(bytes) {
  data_ = resource_.allocate(bytes, 64);
  if (!huge) {
    ::madvise(data_, bytes_, MADV_NOHUGEPAGE);  // advisory, as huge pages are
  }
}

node_buffer::~node_buffer() {
  resource_.deallocate(data_, bytes_, 64);
}

double node_buffer::huge_page_fraction() const {
  std::ifstream in("/proc/self/smaps");
  if (!in) {
    return -1;
  }
  const auto begin = reinterpret_cast<std::uintptr_t>(data_);
  const auto end = begin + bytes_;
  std::string line;
  double share = 0;  // of the current mapping that overlaps the buffer
  double huge_bytes = 0;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      // A mapping header line ("lo-hi perms ..."). Neighbouring buffers may share one
      // mapping: count its huge pages in proportion to the overlap.
      const auto overlap = std::min<std::uintptr_t>(hi, end) - std::max<std::uintptr_t>(lo, begin);
      share = lo < end && hi > begin && hi > lo
                  ? static_cast<double>(overlap) / static_cast<double>(hi - lo)
                  : 0.0;
      continue;
    }
    if (share > 0 && line.rfind("AnonHugePages:", 0) == 0) {
      huge_bytes += share * 1024.0 * static_cast<double>(std::stoull(line.substr(14)));
    }
  }
  return std::min(1.0, huge_bytes / static_cast<double>(bytes_));
}

}  // namespace tierflow::cli
