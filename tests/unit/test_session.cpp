// The session on the emulated device: its passes stage each block's weights from their tier
// copies, its optimizer equals one composed by hand bit for bit, and it never lets the optimizer
// write a tier copy the scheduler may still read.
#include <chrono>
#include <cstring>
#include <thread>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/detail/adam_master.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/session.hpp"

namespace tierflow {
namespace {

std::shared_ptr<device> session_device() {
  return std::shared_ptr<device>(emulated_device::create(test::rig_device_options()));
}

session_options quiet_options(std::uint64_t window) {
  session_options o;
  o.window = window;
  return o;
}

// A session over @p blocks blocks of fp32 weights of random sizes, its tier copies filled with
// random non-zero floats; @p init gets each weight's values.
std::unique_ptr<session> random_session(std::mt19937_64& gen, std::size_t blocks,
                                        std::uint64_t window,
                                        std::vector<std::vector<float>>& init) {
  auto s = std::make_unique<session>(session_device(), topology::discover(), quiet_options(window));
  std::vector<std::vector<session_weight>> plan(blocks);
  for (auto& block : plan) {
    const std::size_t count = test::uniform(gen, 1, 3);
    for (std::size_t j = 0; j < count; ++j) {
      block.push_back({"", test::uniform(gen, 1, 3000) * sizeof(float), nullptr});
    }
  }
  s->set_blocks(std::move(plan));
  init.clear();
  for (std::size_t w = 0; w < s->weight_count(); ++w) {
    init.push_back(test::nonzero_normals(s->weight_bytes(w) / sizeof(float), 1.0f, gen));
    std::memcpy(s->weight_host(w), init.back().data(), s->weight_bytes(w));
  }
  return s;
}

// Whether every weight of @p block, as staged, holds its tier copy's bytes.
bool staged_matches(session& s, const staged_step& st, std::size_t block) {
  st.compute().synchronize();  // the staging lands on the compute stream
  for (std::size_t w = 0; w < s.weight_count(); ++w) {
    if (s.block_of(w) == block && std::memcmp(st.pointer(static_cast<buffer_id>(w)),
                                              s.weight_host(w), s.weight_bytes(w)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("session: a pass stages each block from its tier copy, block 0's backward ends it",
          "[session]") {
  auto gen = test::rng(1101);
  for (const std::uint64_t window : {0, 1, 3}) {
    std::vector<std::vector<float>> init;
    const std::size_t blocks = test::uniform(gen, 2, 6);
    auto s = random_session(gen, blocks, window, init);
    INFO("window " << window << ", blocks " << blocks);
    for (int pass = 0; pass < 3; ++pass) {
      for (std::size_t b = 0; b < blocks; ++b) {
        CHECK(staged_matches(*s, s->acquire(b, pass_direction::forward), b));
        s->release();
        CHECK(s->pass_open());
      }
      for (std::size_t b = blocks; b-- > 0;) {
        CHECK(staged_matches(*s, s->acquire(b, pass_direction::backward), b));
        s->release();
      }
      CHECK_FALSE(s->pass_open());
      CHECK(s->passes() == static_cast<std::uint64_t>(pass + 1));
      // Between passes the tier copies are the caller's: new values are what the next stages.
      for (std::size_t w = 0; w < s->weight_count(); ++w) {
        auto* host = static_cast<float*>(s->weight_host(w));
        host[0] = static_cast<float>(pass + 2) * 0.5f;
      }
    }
  }
}

TEST_CASE("session: skipped blocks go by, a block behind the pass starts a new one", "[session]") {
  auto gen = test::rng(1103);
  std::vector<std::vector<float>> init;
  auto s = random_session(gen, 5, 2, init);
  // Forward 0, 3 (1 and 2 go by), then forward 1: behind the pass, so a new pass.
  CHECK(staged_matches(*s, s->acquire(0, pass_direction::forward), 0));
  CHECK(staged_matches(*s, s->acquire(3, pass_direction::forward), 3));
  CHECK(s->passes() == 0);
  CHECK(staged_matches(*s, s->acquire(1, pass_direction::forward), 1));
  CHECK(s->passes() == 1);
  // An exception halfway (a block held, never released): the next forward of block 0 starts
  // over, and the session works on.
  CHECK(staged_matches(*s, s->acquire(0, pass_direction::forward), 0));
  CHECK(s->passes() == 2);
  CHECK(staged_matches(*s, s->acquire(4, pass_direction::backward), 4));
  s->end_pass();
  CHECK_FALSE(s->pass_open());
  s->end_pass();  // no pass open: a no-op
  CHECK(s->passes() == 3);
}

TEST_CASE("session: bad plans and arguments are refused with the reason", "[session][errors]") {
  auto dev = session_device();
  session s(dev, topology::discover(), quiet_options(2));
  CHECK_THROWS_WITH(s.acquire(0, pass_direction::forward), Catch::Contains("no weight plan"));
  CHECK_THROWS_WITH(s.set_blocks({}), Catch::Contains("has no blocks"));
  CHECK_THROWS_WITH(s.set_blocks({{{"a", 64, nullptr}}, {}}), Catch::Contains("block 1 has no"));
  CHECK_THROWS_WITH(s.set_blocks({{{"a", 0, nullptr}}}), Catch::Contains("'a' has 0 bytes"));
  CHECK_THROWS_WITH(s.set_blocks({{{"a", 64, nullptr}}, {{"a", 64, nullptr}}}),
                    Catch::Contains("two weights are named 'a'"));
  CHECK_FALSE(s.has_plan());
  std::vector<float> mine(32, 1.5f);
  s.set_blocks({{{"a", 64, nullptr}}, {{"b", mine.size() * sizeof(float), mine.data()}}});
  CHECK(s.weight_host(1) == mine.data());
  CHECK(s.weight_tier(1).empty());
  CHECK_FALSE(s.weight_tier(0).empty());
  CHECK_THROWS_WITH(s.set_blocks({{{"c", 64, nullptr}}}), Catch::Contains("set already"));
  CHECK_THROWS_WITH(s.acquire(2, pass_direction::forward), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(s.weight_host(2), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(s.optimizer(), Catch::Contains("no optimizer"));

  adam_group g;
  adam_param p;
  p.name = "a";
  p.elements = 15;  // 60 bytes, the weight has 64
  p.weight = 0;
  g.params.push_back(p);
  CHECK_THROWS_WITH(s.make_optimizer({g}, {}), Catch::Contains("names weight 'a' of 64 bytes"));
  g.params[0].weight = 9;
  CHECK_THROWS_WITH(s.make_optimizer({g}, {}), Catch::Contains("weight 9 out of range"));
  // Without a session, a param that names a weight has no memory.
  g.params[0].weight = 0;
  g.params[0].elements = 16;
  placement_policy placement = test::rig_placement(s.topo());
  CHECK_THROWS_WITH(offload_adam(*dev, {g}, {}, placement),
                    Catch::Contains("made without a session"));
}

namespace {

// A group over every weight of @p s by index, each with a grad in device memory (@p grads gets
// them, for the caller to fill and free).
adam_group weights_group(session& s, std::vector<void*>& grads) {
  adam_group group;
  for (std::size_t w = 0; w < s.weight_count(); ++w) {
    grads.push_back(s.dev().memory().allocate(s.weight_bytes(w)));
    adam_param p;
    p.name = s.weight_name(w);
    p.weight = w;
    p.grad = grads.back();
    p.elements = s.weight_bytes(w) / sizeof(float);
    group.params.push_back(p);
  }
  return group;
}

// One training run over a session: @p steps iterations of forward + backward through the
// session, each with fresh grads, then the optimizer's step. With @p announce, every weight's
// grad is announced (grad_ready) as its block's backward runs. Returns the tier copies.
struct session_run {
  std::size_t blocks;
  std::uint64_t seed;
  adam_overlap overlap;
  bool announce;
  bool step_mid_pass;  // step after the forward pass only, the backward never run
};

std::vector<std::vector<float>> train_in_session(const session_run& r,
                                                 std::vector<std::vector<float>>& init) {
  std::mt19937_64 gen(r.seed);
  auto s = random_session(gen, r.blocks, 2, init);
  device& dev = s->dev();
  std::vector<void*> grads;
  adam_group group = weights_group(*s, grads);
  group.hyper.lr = 1e-2;
  group.hyper.weight_decay = 0.05;
  adam_options o;
  o.mode = adam_mode::cpu;
  o.chunk_elements = 512;
  o.threads = 2;
  o.overlap = r.overlap;
  offload_adam& opt = s->make_optimizer({group}, o);
  std::mt19937_64 grad_gen(r.seed + 1);
  for (int step = 0; step < 4; ++step) {
    for (std::size_t w = 0; w < s->weight_count(); ++w) {
      const auto g = test::nonzero_normals(s->weight_bytes(w) / sizeof(float), 0.3f, grad_gen);
      std::memcpy(grads[w], g.data(), s->weight_bytes(w));
    }
    for (std::size_t b = 0; b < r.blocks; ++b) {
      (void)s->acquire(b, pass_direction::forward);
      s->release();
    }
    if (!r.step_mid_pass) {
      for (std::size_t b = r.blocks; b-- > 0;) {
        (void)s->acquire(b, pass_direction::backward);
        if (r.announce) {
          for (std::size_t w = 0; w < s->weight_count(); ++w) {
            if (s->block_of(w) == b) {
              opt.grad_ready(0, w);
            }
          }
        }
        s->release();
      }
    }
    CHECK(opt.step().applied);
    CHECK_FALSE(s->pass_open());  // the step ended the pass if it was open
  }
  std::vector<std::vector<float>> out;
  for (std::size_t w = 0; w < s->weight_count(); ++w) {
    const auto* host = static_cast<const float*>(s->weight_host(w));
    out.emplace_back(host, host + s->weight_bytes(w) / sizeof(float));
  }
  for (std::size_t w = 0; w < grads.size(); ++w) {
    dev.memory().deallocate(grads[w], s->weight_bytes(w));
  }
  return out;
}

// The same updates composed by hand: an offload_adam over plain host arrays (param_on_host),
// no scheduler at all.
std::vector<std::vector<float>> train_by_hand(const std::vector<std::vector<float>>& init,
                                              std::uint64_t seed) {
  auto dev = session_device();
  const topology topo = topology::discover();
  placement_policy placement = test::rig_placement(topo);
  std::vector<std::vector<float>> weights = init;
  std::vector<void*> grads;
  adam_group group;
  group.hyper.lr = 1e-2;
  group.hyper.weight_decay = 0.05;
  for (std::size_t w = 0; w < weights.size(); ++w) {
    grads.push_back(dev->memory().allocate(weights[w].size() * sizeof(float)));
    adam_param p;
    p.name = "w" + std::to_string(w);
    p.param = weights[w].data();
    p.param_on_host = true;
    p.grad = grads.back();
    p.elements = weights[w].size();
    group.params.push_back(p);
  }
  adam_options o;
  o.mode = adam_mode::cpu;
  o.chunk_elements = 512;
  o.threads = 2;
  {
    offload_adam opt(*dev, {group}, o, placement);
    std::mt19937_64 grad_gen(seed + 1);
    for (int step = 0; step < 4; ++step) {
      for (std::size_t w = 0; w < weights.size(); ++w) {
        const auto g = test::nonzero_normals(weights[w].size(), 0.3f, grad_gen);
        std::memcpy(grads[w], g.data(), g.size() * sizeof(float));
      }
      CHECK(opt.step().applied);
    }
  }
  for (std::size_t w = 0; w < grads.size(); ++w) {
    dev->memory().deallocate(grads[w], weights[w].size() * sizeof(float));
  }
  return weights;
}

}  // namespace

TEST_CASE("session: its optimizer updates the tier copies as one composed by hand, bit for bit",
          "[session][adam]") {
  auto gen = test::rng(1107);
  const std::array runs{
      session_run{3, gen(), adam_overlap::none, false, false},
      session_run{4, gen(), adam_overlap::none, false, true},
      session_run{3, gen(), adam_overlap::backward, true, false},
      session_run{5, gen(), adam_overlap::backward_publish, true, false},
  };
  for (const auto& r : runs) {
    INFO("blocks " << r.blocks << ", overlap " << to_string(r.overlap) << ", announce "
                   << r.announce << ", step mid-pass " << r.step_mid_pass);
    std::vector<std::vector<float>> init;
    const auto got = train_in_session(r, init);
    const auto want = train_by_hand(init, r.seed);
    REQUIRE(got.size() == want.size());
    for (std::size_t w = 0; w < got.size(); ++w) {
      INFO("weight " << w);
      CHECK(std::memcmp(got[w].data(), want[w].data(), got[w].size() * sizeof(float)) == 0);
      CHECK(got[w] != init[w]);
    }
  }
}

TEST_CASE(
    "session: a grad announced before the backward pass reaches its block is not "
    "published into the tier copy until step()",
    "[session][adam]") {
  auto gen = test::rng(1109);
  std::vector<std::vector<float>> init;
  auto s = random_session(gen, 3, 2, init);
  device& dev = s->dev();
  std::vector<void*> grads;
  adam_group group = weights_group(*s, grads);
  for (std::size_t w = 0; w < s->weight_count(); ++w) {
    const auto g = test::nonzero_normals(s->weight_bytes(w) / sizeof(float), 1.0f, gen);
    std::memcpy(grads[w], g.data(), s->weight_bytes(w));
  }
  adam_options o;
  o.mode = adam_mode::cpu;
  o.overlap = adam_overlap::backward_publish;
  offload_adam& opt = s->make_optimizer({group}, o);
  // The forward pass is open (block 2 of 3 held): every grad is announced now, long before the
  // backward pass could reach its block.
  (void)s->acquire(0, pass_direction::forward);
  s->release();
  (void)s->acquire(2, pass_direction::forward);
  for (std::size_t w = 0; w < s->weight_count(); ++w) {
    opt.grad_ready(0, w);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the updates run meanwhile
  for (std::size_t w = 0; w < s->weight_count(); ++w) {
    INFO("weight " << w);
    CHECK(std::memcmp(s->weight_host(w), init[w].data(), s->weight_bytes(w)) == 0);
  }
  CHECK(opt.step().applied);
  CHECK_FALSE(s->pass_open());
  for (std::size_t w = 0; w < s->weight_count(); ++w) {
    CHECK(std::memcmp(s->weight_host(w), init[w].data(), s->weight_bytes(w)) != 0);
  }
  s->drop_optimizer(opt);
  CHECK_FALSE(s->has_optimizer());
  for (std::size_t w = 0; w < grads.size(); ++w) {
    dev.memory().deallocate(grads[w], s->weight_bytes(w));
  }
}

TEST_CASE(
    "session: bf16 tier copies with the master in 16 bits step as with an fp32 master, bit for "
    "bit",
    "[session][adam][master]") {
  auto gen = test::rng(1110);
  const std::size_t blocks = test::uniform(gen, 2, 4);
  std::vector<std::vector<std::size_t>> sizes(blocks);
  for (auto& block : sizes) {
    for (std::size_t j = 0, count = test::uniform(gen, 1, 2); j < count; ++j) {
      block.push_back(test::uniform(gen, 2000, 9000));
    }
  }
  const auto state = gen() % 2 == 0 ? adam_state_dtype::int8 : adam_state_dtype::f32;
  INFO(blocks << " blocks, " << to_string(state) << " moments");
  const std::uint64_t values_seed = gen();
  struct run {
    std::unique_ptr<session> s;
    std::vector<void*> grads;
    offload_adam* opt = nullptr;
  };
  run runs[2];
  for (int k = 0; k < 2; ++k) {
    run& r = runs[k];
    r.s = std::make_unique<session>(session_device(), topology::discover(), quiet_options(2));
    std::vector<std::vector<session_weight>> plan(blocks);
    for (std::size_t b = 0; b < blocks; ++b) {
      for (std::size_t n : sizes[b]) {
        plan[b].push_back({"", n * 2, nullptr});
      }
    }
    r.s->set_blocks(std::move(plan));
    std::mt19937_64 values(values_seed);
    adam_group group;
    group.hyper.lr = 1e-2;
    group.hyper.weight_decay = 0.05;
    for (std::size_t w = 0; w < r.s->weight_count(); ++w) {
      const std::size_t n = r.s->weight_bytes(w) / 2;
      const auto init =
          test::encode_values(test::nonzero_normals(n, 1.0f, values), param_dtype::bf16);
      std::memcpy(r.s->weight_host(w), init.data(), init.size());
      r.grads.push_back(r.s->dev().memory().allocate(r.s->weight_bytes(w)));
      adam_param p;
      p.name = r.s->weight_name(w);
      p.weight = w;
      p.grad = r.grads.back();
      p.dtype = param_dtype::bf16;
      p.elements = n;
      group.params.push_back(p);
    }
    adam_options o;
    o.mode = adam_mode::cpu;
    o.chunk_elements = 1024;
    o.state_dtype = state;
    o.master = k == 0 ? adam_master::fp32 : adam_master::remainder;
    r.opt = &r.s->make_optimizer({group}, o);
  }
  std::mt19937_64 grad_gen(gen());
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<unsigned char>> g;
    for (std::size_t w = 0; w < runs[0].s->weight_count(); ++w) {
      g.push_back(
          test::encode_values(test::nonzero_normals(runs[0].s->weight_bytes(w) / 2, 0.3f, grad_gen),
                              param_dtype::bf16));
    }
    for (run& r : runs) {
      for (std::size_t w = 0; w < r.s->weight_count(); ++w) {
        std::memcpy(r.grads[w], g[w].data(), g[w].size());
      }
      for (std::size_t b = 0; b < blocks; ++b) {
        (void)r.s->acquire(b, pass_direction::forward);
        r.s->release();
      }
      for (std::size_t b = blocks; b-- > 0;) {
        (void)r.s->acquire(b, pass_direction::backward);
        r.s->release();
      }
      REQUIRE(r.opt->step().applied);
    }
  }
  std::uint64_t low_bits = 0;
  for (std::size_t w = 0; w < runs[0].s->weight_count(); ++w) {
    INFO("weight " << w);
    const std::vector<float> master = runs[0].opt->master_weights(0, w);
    REQUIRE(runs[1].opt->master_weights(0, w) == master);
    CHECK(runs[1].opt->exp_avg_sq(0, w) == runs[0].opt->exp_avg_sq(0, w));
    // The tier copies: the master rounded to even (fp32 master), ties away (remainder).
    std::vector<std::uint16_t> even(master.size()), away(master.size()), low(master.size());
    detail::store_params(adam_kernel::scalar, master.data(), even.data(), param_dtype::bf16,
                         master.size());
    detail::split_master(master.data(), away.data(), low.data(), master.size());
    CHECK(std::memcmp(runs[0].s->weight_host(w), even.data(), even.size() * 2) == 0);
    CHECK(std::memcmp(runs[1].s->weight_host(w), away.data(), away.size() * 2) == 0);
    for (const std::uint16_t l : low) {
      low_bits += l != 0 ? 1 : 0;
    }
  }
  CHECK(low_bits > 0);  // the masters hold bits a bf16 cannot
  // 2 B of master per element instead of 4.
  std::size_t elements = 0;
  for (const auto& block : sizes) {
    for (std::size_t n : block) {
      elements += n;
    }
  }
  CHECK(runs[0].opt->metrics().state_bytes - runs[1].opt->metrics().state_bytes == 2 * elements);
  for (run& r : runs) {
    for (std::size_t w = 0; w < r.grads.size(); ++w) {
      r.s->dev().memory().deallocate(r.grads[w], r.s->weight_bytes(w));
    }
  }
}

}  // namespace tierflow
