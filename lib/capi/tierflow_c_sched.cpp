// The C ABI of the prefetch scheduler: a plan built from C arrays, buffers allocated in a
// host tier when the caller gives none, and acquire/release ordered with the caller's stream.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/capi_support.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/topology.hpp"

struct tf_scheduler {
  // Declared first, so destroyed last (see tf_adam): tf_device_destroy may come first.
  std::shared_ptr<tierflow::device> dev;
  tierflow::topology topo;
  tierflow::placement_policy placement;
  std::vector<tierflow::tier_allocation> owned;  // the buffers it allocated
  std::vector<void*> host;                       // every buffer's tier copy
  std::uint64_t total_bytes = 0;                 // of every buffer, allocated or given
  std::vector<std::vector<tierflow::buffer_id>> step_buffers;
  // Declared last: destroyed first, while the buffers it writes back still exist.
  std::unique_ptr<tierflow::prefetch_scheduler> sched;

  tf_scheduler(tierflow::topology t, tierflow::placement_options po)
      : topo(std::move(t)), placement(topo, std::move(po)) {}
};

namespace {

using namespace tierflow::capi;

constexpr std::size_t slot_alignment = 256;

tierflow::schedule_plan make_plan(tf_scheduler& s, const tf_sched_buffer* buffers,
                                  std::size_t buffer_count, const tf_sched_step* steps,
                                  std::size_t step_count) {
  tierflow::schedule_plan plan;
  for (std::size_t i = 0; i < buffer_count; ++i) {
    const tf_sched_buffer& b = buffers[i];
    const std::string where = "buffers[" + std::to_string(i) + "]";
    if (b.bytes == 0) {
      throw tierflow::error(where + ".bytes is 0");
    }
    void* data = b.data;
    if (data == nullptr) {
      s.owned.push_back(s.placement.allocate(tierflow::data_class::params, b.bytes));
      data = s.owned.back().data();
    }
    s.host.push_back(data);
    s.total_bytes += b.bytes;
    plan.add_buffer(
        {b.name != nullptr ? b.name : "buffer" + std::to_string(i), data, b.bytes, false, false});
  }
  for (std::size_t k = 0; k < step_count; ++k) {
    const tf_sched_step& st = steps[k];
    const std::string where = "steps[" + std::to_string(k) + "]";
    if (st.count == 0 || st.buffers == nullptr) {
      throw tierflow::error(where + " uses no buffers");
    }
    std::vector<tierflow::buffer_id> ids;
    for (std::size_t j = 0; j < st.count; ++j) {
      if (st.buffers[j] >= buffer_count) {
        throw tierflow::error(where + ".buffers[" + std::to_string(j) + "] is " +
                              std::to_string(st.buffers[j]) + ", but there are " +
                              std::to_string(buffer_count) + " buffers");
      }
      ids.push_back(static_cast<tierflow::buffer_id>(st.buffers[j]));
    }
    s.step_buffers.push_back(ids);
    tierflow::step_desc desc;
    desc.name = st.name != nullptr ? st.name : "step" + std::to_string(k);
    (st.writes != 0 ? desc.writes : desc.reads) = std::move(ids);
    plan.add_step(std::move(desc));
  }
  return plan;
}

tf_scheduler& checked(tf_scheduler* s) {
  need(s, "scheduler");
  return *s;
}

}  // namespace

extern "C" {

void tf_sched_options_default(tf_sched_options* options) {
  if (options == nullptr) {
    return;
  }
  options->hbm_budget_bytes = 0;
  options->window = 2;
  options->adaptive = 0;
  options->trace = 0;
  options->placement = nullptr;
  options->prefetch_across_iterations = 1;
}

tf_status tf_scheduler_create(tf_device* device, const tf_sched_buffer* buffers,
                              size_t buffer_count, const tf_sched_step* steps, size_t step_count,
                              const tf_sched_options* options, tf_scheduler** out) {
  return guarded("tf_scheduler_create", [&] {
    need(out, "out");
    *out = nullptr;
    need(device, "device");
    need(buffers, "buffers");
    need(steps, "steps");
    if (buffer_count == 0 || step_count == 0) {
      throw tierflow::error("buffer_count and step_count must be > 0");
    }
    tf_sched_options o;
    tf_sched_options_default(&o);
    if (options != nullptr) {
      o = *options;
    }
    tierflow::placement_options po;
    if (o.placement != nullptr) {
      po.spec = std::string(o.placement);
    }
    auto s = std::make_unique<tf_scheduler>(tierflow::topology::discover(), std::move(po));
    tierflow::schedule_plan plan = make_plan(*s, buffers, buffer_count, steps, step_count);
    tierflow::scheduler_options so;
    so.window = o.window;
    so.adaptive = o.adaptive != 0;
    so.trace = o.trace != 0;
    so.prefetch_across_iterations = o.prefetch_across_iterations != 0;
    so.alignment = slot_alignment;
    so.hbm_budget_bytes = o.hbm_budget_bytes;  // 0: the scheduler's default
    s->dev = device->dev;
    s->sched = std::make_unique<tierflow::prefetch_scheduler>(*device->dev, std::move(plan), so);
    *out = s.release();
  });
}

void tf_scheduler_destroy(tf_scheduler* scheduler) {
  delete scheduler;  // the scheduler's destructor never throws (it logs)
}

tf_status tf_scheduler_host_pointer(const tf_scheduler* scheduler, size_t buffer, void** out) {
  return guarded("tf_scheduler_host_pointer", [&] {
    need(scheduler, "scheduler");
    need(out, "out");
    if (buffer >= scheduler->host.size()) {
      throw tierflow::error("buffer " + std::to_string(buffer) + " out of range (" +
                            std::to_string(scheduler->host.size()) + " buffers)");
    }
    *out = scheduler->host[buffer];
  });
}

tf_status tf_scheduler_acquire(tf_scheduler* scheduler, size_t step, void* stream, void** pointers,
                               size_t count) {
  return guarded("tf_scheduler_acquire", [&] {
    tf_scheduler& s = checked(scheduler);
    need(pointers, "pointers");
    if (step < s.step_buffers.size() && count != s.step_buffers[step].size()) {
      throw tierflow::error("step " + std::to_string(step) + " uses " +
                            std::to_string(s.step_buffers[step].size()) + " buffers, count is " +
                            std::to_string(count));
    }
    const tierflow::staged_step& staged = s.sched->acquire(step);
    for (std::size_t j = 0; j < count; ++j) {
      pointers[j] = staged.pointer(s.step_buffers[step][j]);
    }
    if (s.dev->compute_stream().native_handle() != nullptr) {
      s.dev->native_after_stream(stream, staged.compute());
    } else {
      staged.compute().synchronize();  // the caller's thread reads the buffers next
    }
  });
}

tf_status tf_scheduler_release(tf_scheduler* scheduler, size_t step, int dirty, void* stream) {
  return guarded("tf_scheduler_release", [&] {
    tf_scheduler& s = checked(scheduler);
    s.dev->stream_after_native(s.dev->compute_stream(), stream);
    s.sched->release(step, dirty != 0);
  });
}

tf_status tf_scheduler_flush(tf_scheduler* scheduler) {
  return guarded("tf_scheduler_flush", [&] { checked(scheduler).sched->flush(); });
}

tf_status tf_scheduler_restart(tf_scheduler* scheduler) {
  return guarded("tf_scheduler_restart", [&] { checked(scheduler).sched->restart(); });
}

tf_status tf_scheduler_metrics_json(tf_scheduler* scheduler, char* buffer, size_t capacity,
                                    size_t* needed) {
  std::string json;
  const tf_status s = guarded("tf_scheduler_metrics_json",
                              [&] { json = checked(scheduler).sched->snapshot_json(); });
  return s != TF_OK ? s : json_out("tf_scheduler_metrics_json", json, buffer, capacity, needed);
}

tf_status tf_scheduler_trace_json(tf_scheduler* scheduler, char* buffer, size_t capacity,
                                  size_t* needed) {
  std::string json;
  const tf_status s =
      guarded("tf_scheduler_trace_json", [&] { json = checked(scheduler).sched->trace_json(); });
  return s != TF_OK ? s : json_out("tf_scheduler_trace_json", json, buffer, capacity, needed);
}

tf_status tf_scheduler_where_json(const tf_scheduler* scheduler, char* buffer, size_t capacity,
                                  size_t* needed) {
  std::string json;
  const tf_status s = guarded("tf_scheduler_where_json", [&] {
    need(scheduler, "scheduler");
    const tf_scheduler& sc = *scheduler;
    std::map<std::string, std::uint64_t> tiers;
    std::uint64_t owned_bytes = 0;
    for (const auto& a : sc.owned) {
      tiers[a.tier()] += a.size();
      owned_bytes += a.size();
    }
    tierflow::metrics::json_writer w;
    w.begin_object().key("tiers").begin_object();
    for (const auto& [tier, bytes] : tiers) {
      w.key(tier).value(bytes);
    }
    w.end_object().key("caller_bytes").value(sc.total_bytes - owned_bytes).end_object();
    json = w.str();
  });
  return s != TF_OK ? s : json_out("tf_scheduler_where_json", json, buffer, capacity, needed);
}

}  // extern "C"
