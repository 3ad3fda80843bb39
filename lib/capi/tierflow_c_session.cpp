// The C ABI of the session: one handle over tierflow::session, its weight plan driven block by
// block with the caller's stream, and optimizers made in it.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capi/adam_handle.hpp"
#include "capi/capi_support.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/session.hpp"

struct tf_session {
  std::shared_ptr<tierflow::session> s;
  // Where the weights it allocated live (tf_session_where_json): tier name -> bytes.
  std::map<std::string, std::uint64_t> tiers;
  std::uint64_t caller_bytes = 0;
};

namespace {

using namespace tierflow::capi;

tierflow::session& checked(tf_session* s) {
  need(s, "session");
  return *s->s;
}

std::vector<std::vector<tierflow::session_weight>> blocks_of(const tf_session_weight* weights,
                                                             const size_t* block_sizes,
                                                             size_t block_count) {
  need(weights, "weights");
  need(block_sizes, "block_sizes");
  if (block_count == 0) {
    throw tierflow::error("block_count must be > 0");
  }
  std::vector<std::vector<tierflow::session_weight>> blocks(block_count);
  std::size_t next = 0;
  for (std::size_t b = 0; b < block_count; ++b) {
    if (block_sizes[b] == 0) {
      throw tierflow::error("block_sizes[" + std::to_string(b) + "] is 0");
    }
    for (std::size_t j = 0; j < block_sizes[b]; ++j, ++next) {
      const tf_session_weight& w = weights[next];
      blocks[b].push_back({w.name != nullptr ? w.name : "", w.bytes, w.data, false});
    }
  }
  return blocks;
}

}  // namespace

extern "C" {

void tf_session_options_default(tf_session_options* options) {
  if (options == nullptr) {
    return;
  }
  const tierflow::session_options d;
  options->hbm_budget_bytes = d.hbm_budget_bytes;
  options->window = d.window;
  options->adaptive = d.adaptive ? 1 : 0;
  options->trace = d.trace ? 1 : 0;
  options->placement = nullptr;
}

tf_status tf_session_create(tf_device* device, const tf_session_options* options,
                            tf_session** out) {
  return guarded("tf_session_create", [&] {
    need(out, "out");
    *out = nullptr;
    need(device, "device");
    tf_session_options o;
    tf_session_options_default(&o);
    if (options != nullptr) {
      o = *options;
    }
    if ((o.adaptive != 0 && o.adaptive != 1) || (o.trace != 0 && o.trace != 1)) {
      throw tierflow::error("options->adaptive and options->trace must be 0 or 1");
    }
    tierflow::session_options so;
    so.window = o.window;
    so.hbm_budget_bytes = o.hbm_budget_bytes;
    so.adaptive = o.adaptive != 0;
    so.trace = o.trace != 0;
    if (o.placement != nullptr) {
      so.placement.spec = std::string(o.placement);
    }
    auto h = std::make_unique<tf_session>();
    h->s = std::make_shared<tierflow::session>(device->dev, std::move(so));
    *out = h.release();
  });
}

void tf_session_destroy(tf_session* session) {
  delete session;  // the session's destructor never throws (it logs)
}

tf_status tf_session_set_blocks(tf_session* session, const tf_session_weight* weights,
                                const size_t* block_sizes, size_t block_count) {
  return guarded("tf_session_set_blocks", [&] {
    tierflow::session& s = checked(session);
    std::vector<std::vector<tierflow::session_weight>> blocks =
        blocks_of(weights, block_sizes, block_count);
    std::uint64_t caller = 0;
    for (const auto& block : blocks) {
      for (const auto& w : block) {
        caller += w.data != nullptr ? w.bytes : 0;
      }
    }
    s.set_blocks(std::move(blocks));
    session->caller_bytes = caller;
    for (std::size_t w = 0; w < s.weight_count(); ++w) {
      if (const std::string& tier = s.weight_tier(w); !tier.empty()) {
        session->tiers[tier] += s.weight_bytes(w);
      }
    }
  });
}

tf_status tf_session_weight_host(const tf_session* session, size_t weight, void** out) {
  return guarded("tf_session_weight_host", [&] {
    need(session, "session");
    need(out, "out");
    *out = session->s->weight_host(weight);
  });
}

tf_status tf_session_acquire(tf_session* session, size_t block, int backward, void* stream,
                             void** pointers, size_t count) {
  return guarded("tf_session_acquire", [&] {
    tierflow::session& s = checked(session);
    need(pointers, "pointers");
    if (backward != 0 && backward != 1) {
      throw tierflow::error("backward must be 0 or 1, not " + std::to_string(backward));
    }
    if (block < s.block_count() && count != s.block_size(block)) {
      throw tierflow::error("block " + std::to_string(block) + " has " +
                            std::to_string(s.block_size(block)) + " weights, count is " +
                            std::to_string(count));
    }
    const auto direction =
        backward != 0 ? tierflow::pass_direction::backward : tierflow::pass_direction::forward;
    tierflow::device& dev = s.dev();
    // The block held is released by the acquire: after the caller's work on it so far.
    dev.stream_after_native(dev.compute_stream(), stream);
    const tierflow::staged_step& staged = s.acquire(block, direction);
    for (std::size_t j = 0; j < count; ++j) {
      pointers[j] = staged.pointer(static_cast<tierflow::buffer_id>(s.weight(block, j)));
    }
    if (dev.compute_stream().native_handle() != nullptr) {
      dev.native_after_stream(stream, staged.compute());
    } else {
      staged.compute().synchronize();  // the caller's thread reads the buffers next
    }
  });
}

tf_status tf_session_release(tf_session* session, void* stream) {
  return guarded("tf_session_release", [&] {
    tierflow::session& s = checked(session);
    s.dev().stream_after_native(s.dev().compute_stream(), stream);
    s.release();
  });
}

tf_status tf_session_end_pass(tf_session* session) {
  return guarded("tf_session_end_pass", [&] { checked(session).end_pass(); });
}

tf_status tf_session_metrics_json(tf_session* session, char* buffer, size_t capacity,
                                  size_t* needed) {
  std::string json;
  const tf_status status = guarded("tf_session_metrics_json", [&] {
    tierflow::session& s = checked(session);
    tierflow::metrics::json_writer w;
    w.begin_object();
    w.key("schema_version").value(std::uint64_t{tierflow::metrics::snapshot_schema_version});
    w.key("scheduler").raw(s.scheduler().metrics().to_json());
    w.key("passes").value(std::uint64_t{s.passes()});
    w.key("pass_open").value(s.pass_open());
    w.end_object();
    json = w.str();
  });
  return status != TF_OK ? status
                         : json_out("tf_session_metrics_json", json, buffer, capacity, needed);
}

tf_status tf_session_trace_json(tf_session* session, char* buffer, size_t capacity,
                                size_t* needed) {
  std::string json;
  const tf_status status =
      guarded("tf_session_trace_json", [&] { json = checked(session).scheduler().trace_json(); });
  return status != TF_OK ? status
                         : json_out("tf_session_trace_json", json, buffer, capacity, needed);
}

tf_status tf_session_where_json(const tf_session* session, char* buffer, size_t capacity,
                                size_t* needed) {
  std::string json;
  const tf_status status = guarded("tf_session_where_json", [&] {
    need(session, "session");
    tierflow::metrics::json_writer w;
    w.begin_object().key("tiers").begin_object();
    for (const auto& [tier, bytes] : session->tiers) {
      w.key(tier).value(bytes);
    }
    w.end_object().key("caller_bytes").value(session->caller_bytes).end_object();
    json = w.str();
  });
  return status != TF_OK ? status
                         : json_out("tf_session_where_json", json, buffer, capacity, needed);
}

tf_status tf_session_adam_create(tf_session* session, const tf_adam_param* params, size_t count,
                                 const size_t* weights, const tf_adam_hyper* hypers, size_t groups,
                                 const tf_adam_options* options, tf_adam** out) {
  return guarded("tf_session_adam_create", [&] {
    need(out, "out");
    *out = nullptr;
    tierflow::session& s = checked(session);
    if (options != nullptr && options->placement != nullptr) {
      throw tierflow::error(
          "options->placement must be NULL: the session's placement places the state "
          "(tf_session_options.placement)");
    }
    auto a = std::make_unique<tf_adam>();
    std::vector<tierflow::adam_group> gs = adam_groups(params, count, weights, hypers, groups, *a);
    const tierflow::adam_options o = adam_options_of(options);
    a->dev = s.shared_device();
    a->topo = &s.topo();
    a->opt = &s.make_optimizer(std::move(gs), o);
    a->session = session->s;
    *out = a.release();
  });
}

}  // extern "C"
