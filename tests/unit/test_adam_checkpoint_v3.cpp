// Checkpoint format version 3 (issue 37): compressed moments saved as they are and loaded bit
// for bit, conversions between state dtypes through fp32, a version 2 file written by the old
// code loading into every state dtype, and corrupted or non-finite files refused with the live
// state untouched.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_host_fixture.hpp"
#include "core/crc32c.hpp"
#include "test_support.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/offload_adam.hpp"

using namespace tierflow;
using namespace tierflow::test::host_fixture;

namespace {

using bytes_t = std::vector<unsigned char>;

bytes_t read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_all(const std::filesystem::path& path, const bytes_t& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
T get(const bytes_t& bytes, std::size_t at) {
  T value{};
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

template <typename T>
void put(bytes_t& bytes, std::size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

std::size_t header_bytes(const bytes_t& file) {
  return get<std::uint32_t>(file, 12);
}

std::size_t payload_offset(const bytes_t& file) {
  return 16 + header_bytes(file) + 4;
}

// After an edit of the header: its CRC again.
void fix_header_crc(bytes_t& file) {
  const std::size_t end = 16 + header_bytes(file);
  put<std::uint32_t>(file, end, detail::crc32c(file.data(), end));
}

// After an edit of a piece of @p bytes at @p at: its CRC again.
void fix_piece_crc(bytes_t& file, std::size_t at, std::size_t bytes) {
  put<std::uint32_t>(file, at + bytes, detail::crc32c(file.data() + at, bytes));
}

// Where group 0's first param's state dtype byte is (the first group's record is 54 bytes).
std::size_t first_state_dtype_at(const bytes_t& file) {
  const std::size_t param_at = 16 + 8 + 4 + 54;
  return param_at + 2 + get<std::uint16_t>(file, param_at) + 1;
}

// The dtype a param's moments have in an optimizer of @p dtype.
adam_state_dtype effective(adam_state_dtype dtype, std::size_t elements) {
  return dtype == adam_state_dtype::int8 && elements < int8_min_elements ? adam_state_dtype::f32
                                                                         : dtype;
}

// fp32 moments as a param of @p dtype holds them: encoded, then decoded.
void quantize(adam_state_dtype dtype, std::vector<float>& m, std::vector<float>& v) {
  const std::size_t n = m.size();
  bytes_t m_raw(detail::moment_bytes(dtype, n));
  bytes_t v_raw(m_raw.size());
  std::vector<float> ms(detail::scale_count(dtype, n));
  std::vector<float> vs(ms.size());
  const detail::state_arrays st{dtype, m_raw.data(), v_raw.data(), ms.data(), vs.data()};
  detail::encode_moments(adam_kernel::scalar, st, 0, n, m.data(), v.data());
  detail::decode_moments(st, 0, n, m.data(), v.data());
}

struct rig {
  std::unique_ptr<emulated_device> dev = host_test_device();
  topology topo = topology::discover();
  placement_policy policy = test_placement(topo);
  test::scratch_dir dir;
};

struct param_state_copy {
  std::vector<float> master, m, v;
  std::uint64_t steps = 0;
};

std::vector<param_state_copy> state_of(const offload_adam& opt) {
  std::vector<param_state_copy> out;
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    for (std::size_t p = 0; p < opt.param_count(g); ++p) {
      out.push_back({opt.master_weights(g, p), opt.exp_avg(g, p), opt.exp_avg_sq(g, p),
                     opt.step_count(g, p)});
    }
  }
  return out;
}

void check_same_state(const std::vector<param_state_copy>& a,
                      const std::vector<param_state_copy>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("param " << i << " of " << a[i].master.size() << " elements");
    CHECK(same_bits(a[i].master, b[i].master));
    CHECK(same_bits(a[i].m, b[i].m));
    CHECK(same_bits(a[i].v, b[i].v));
    CHECK(a[i].steps == b[i].steps);
  }
}

// A large fp32 param, a large bf16 one and a small fp32 one (int8 keeps it fp32).
std::vector<std::size_t> random_sizes(std::mt19937_64& gen) {
  return {int8_min_elements + gen() % 6000, int8_min_elements + gen() % 6000, 50 + gen() % 3000};
}

std::vector<host_param> params_of(const std::vector<std::size_t>& sizes, std::mt19937_64& gen) {
  std::vector<host_param> out;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out.emplace_back(i == 1 ? param_dtype::bf16 : param_dtype::f32, sizes[i], gen);
  }
  return out;
}

std::unique_ptr<offload_adam> optimizer(rig& r, std::vector<host_param>& params,
                                        adam_state_dtype dtype, std::size_t chunk,
                                        const adam_hyper& hyper = {}) {
  adam_options o;
  o.mode = adam_mode::cpu;
  o.state_dtype = dtype;
  o.threads = 2;
  o.chunk_elements = chunk;  // rounded up to whole blocks for int8
  return std::make_unique<offload_adam>(
      *r.dev, std::vector<adam_group>{group_of(params, "p", hyper)}, o, r.policy);
}

void step_with_fresh_grads(offload_adam& opt, std::vector<host_param>& params, std::mt19937_64& gen,
                           int steps) {
  for (int s = 0; s < steps; ++s) {
    for (auto& p : params) {
      p.draw_grads(gen);
    }
    REQUIRE(opt.step().applied);
  }
}

adam_hyper random_hyper(std::mt19937_64& gen) {
  adam_hyper h;
  h.lr = 1e-3 * static_cast<double>(1 + gen() % 20);
  h.weight_decay = 0.01 * static_cast<double>(gen() % 5);
  return h;
}

// ---- the version 2 fixture (tests/data/adam/checkpoint_v2/rules.json says how it was made)
// ----------

struct v2_param {
  const char* name;
  param_dtype dtype;
  std::size_t elements;
  std::size_t group;
};

constexpr v2_param v2_params[] = {{"w", param_dtype::f32, 5000, 0},
                                  {"n", param_dtype::f32, 300, 0},
                                  {"e", param_dtype::bf16, 4500, 1}};
constexpr std::size_t v2_piece = 2048;

adam_hyper v2_hyper(std::size_t group) {
  adam_hyper h;
  if (group == 0) {
    h.lr = 1e-2;
    h.weight_decay = 0.05;
  } else {
    h.lr = 3e-3;
    h.beta1 = 0.8;
    h.weight_decay = 0.01;
    h.decay = weight_decay_mode::l2;
  }
  return h;
}

float as_bf16(float x) {
  return detail::bf16_to_float(detail::float_to_bf16(x));
}

// The fixture's state by its rules: the scalar reference over its starts and grads.
std::vector<param_state_copy> v2_reference() {
  std::vector<param_state_copy> out;
  for (std::size_t k = 0; k < 3; ++k) {
    const v2_param& spec = v2_params[k];
    const bool bf16 = spec.dtype == param_dtype::bf16;
    param_state_copy s;
    for (std::size_t i = 0; i < spec.elements; ++i) {
      const float start =
          static_cast<float>(static_cast<long>((i * 7919 + k * 101) % 2001) - 1000) / 512.0f;
      s.master.push_back(bf16 ? as_bf16(start) : start);
    }
    s.m.assign(spec.elements, 0.0f);
    s.v.assign(spec.elements, 0.0f);
    for (std::uint64_t t = 1; t <= 3; ++t) {
      const auto scalars = detail::make_adam_scalars(v2_hyper(spec.group), t, 1.0);
      for (std::size_t i = 0; i < spec.elements; ++i) {
        const float g =
            static_cast<float>(static_cast<long>((i * 31 + k * 13 + t * 977) % 401) - 200) /
            4096.0f;
        detail::adam_reference(s.master[i], s.m[i], s.v[i], bf16 ? as_bf16(g) : g, scalars);
      }
    }
    s.steps = 3;
    out.push_back(std::move(s));
  }
  return out;
}

// The values in a version 2 file of the fixture's shape, read by the documented layout.
std::vector<param_state_copy> v2_values(const bytes_t& file) {
  std::vector<param_state_copy> out;
  std::size_t at = payload_offset(file);
  for (const v2_param& spec : v2_params) {
    param_state_copy s;
    for (std::size_t off = 0; off < spec.elements; off += v2_piece) {
      const std::size_t count = std::min(v2_piece, spec.elements - off);
      for (std::vector<float>* array : {&s.master, &s.m, &s.v}) {
        for (std::size_t i = 0; i < count; ++i, at += 4) {
          array->push_back(get<float>(file, at));
        }
      }
      at += 4;  // the piece's CRC
    }
    s.steps = 3;
    out.push_back(std::move(s));
  }
  CHECK(at + 8 == file.size());
  return out;
}

struct v2_optimizer {
  std::vector<host_param> params;
  std::unique_ptr<offload_adam> opt;
};

v2_optimizer v2_shaped(rig& r, adam_state_dtype dtype, std::mt19937_64& gen) {
  v2_optimizer out;
  for (const v2_param& spec : v2_params) {
    out.params.emplace_back(spec.dtype, spec.elements, gen);
  }
  std::vector<adam_group> groups(2);
  for (std::size_t k = 0; k < 3; ++k) {
    host_param& p = out.params[k];
    groups[v2_params[k].group].params.push_back(
        {v2_params[k].name, p.param(), p.grad(), p.dtype, p.size()});
  }
  adam_options o;
  o.mode = adam_mode::cpu;
  o.state_dtype = dtype;
  o.threads = 2;
  o.chunk_elements = 1024;
  out.opt = std::make_unique<offload_adam>(*r.dev, groups, o, r.policy);
  return out;
}

std::filesystem::path v2_fixture() {
  return test::data_dir() / "adam" / "checkpoint_v2" / "checkpoint_v2.tfck";
}

}  // namespace

TEST_CASE("checkpoint v3: int8 and bf16 moments round-trip bit for bit and step on alike",
          "[adam][checkpoint]") {
  auto gen = test::rng(3801);
  rig r;
  for (adam_state_dtype dtype : {adam_state_dtype::bf16, adam_state_dtype::int8}) {
    const std::vector<std::size_t> sizes = random_sizes(gen);
    const std::size_t chunk_a = 300 + gen() % 5000;
    const std::size_t chunk_b = 300 + gen() % 5000;
    INFO(to_string(dtype) << ": params " << sizes[0] << ", " << sizes[1] << ", " << sizes[2]
                          << "; chunks " << chunk_a << ", " << chunk_b);
    std::vector<host_param> a = params_of(sizes, gen);
    std::vector<host_param> b = params_of(sizes, gen);
    const adam_hyper hyper = random_hyper(gen);
    auto saved = optimizer(r, a, dtype, chunk_a, hyper);
    auto loaded = optimizer(r, b, dtype, chunk_b);  // the file brings the hyper-parameters
    step_with_fresh_grads(*saved, a, gen, 3);
    const auto path = r.dir.path() / ("a_" + std::string(to_string(dtype)) + ".tfck");
    saved->save(path);
    const bytes_t file = read_all(path);
    CHECK(get<std::uint32_t>(file, 8) == 3);
    CHECK(file[first_state_dtype_at(file)] == static_cast<unsigned char>(dtype));
    loaded->load(path);
    check_same_state(state_of(*saved), state_of(*loaded));
    for (int s = 0; s < 2; ++s) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        a[i].draw_grads(gen);
        b[i].g = a[i].g;  // the same storage, the same values
        b[i].g16 = a[i].g16;
      }
      REQUIRE(saved->step().applied);
      REQUIRE(loaded->step().applied);
      INFO("step " << s + 1 << " after the load");
      check_same_state(state_of(*saved), state_of(*loaded));
    }
  }
}

TEST_CASE("checkpoint v3: a version 2 file loads into fp32, bf16 and int8 moments",
          "[adam][checkpoint]") {
  auto gen = test::rng(3802);
  rig r;
  const bytes_t file = read_all(v2_fixture());
  REQUIRE(file.size() > 16);
  CHECK(get<std::uint32_t>(file, 8) == 2);
  const std::vector<param_state_copy> in_file = v2_values(file);
  // The fixture holds what its rules say (checkpoint_v2/rules.json).
  check_same_state(in_file, v2_reference());
  for (adam_state_dtype dtype :
       {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    INFO("into " << to_string(dtype));
    v2_optimizer live = v2_shaped(r, dtype, gen);
    live.opt->load(v2_fixture());
    std::vector<param_state_copy> expected = in_file;
    for (std::size_t k = 0; k < expected.size(); ++k) {
      quantize(effective(dtype, expected[k].m.size()), expected[k].m, expected[k].v);
    }
    check_same_state(state_of(*live.opt), expected);
    CHECK(live.opt->step_count(1) == 3);
  }
}

TEST_CASE("checkpoint v3: moments convert between fp32, bf16 and int8 through save and load",
          "[adam][checkpoint]") {
  auto gen = test::rng(3803);
  rig r;
  const std::pair<adam_state_dtype, adam_state_dtype> conversions[] = {
      {adam_state_dtype::f32, adam_state_dtype::int8},
      {adam_state_dtype::int8, adam_state_dtype::f32},
      {adam_state_dtype::bf16, adam_state_dtype::int8},
      {adam_state_dtype::int8, adam_state_dtype::bf16},
      {adam_state_dtype::f32, adam_state_dtype::bf16}};
  for (const auto& [from, to] : conversions) {
    const std::vector<std::size_t> sizes = random_sizes(gen);
    INFO(to_string(from) << " -> " << to_string(to) << ": params " << sizes[0] << ", " << sizes[1]
                         << ", " << sizes[2]);
    std::vector<host_param> a = params_of(sizes, gen);
    std::vector<host_param> b = params_of(sizes, gen);
    auto saved = optimizer(r, a, from, 300 + gen() % 5000, random_hyper(gen));
    auto loaded = optimizer(r, b, to, 300 + gen() % 5000);
    step_with_fresh_grads(*saved, a, gen, 3);
    const auto path = r.dir.path() / "converted.tfck";
    saved->save(path);
    loaded->load(path);
    // The saved optimizer's moments as fp32 (decoded), held as the loading one holds them.
    std::vector<param_state_copy> expected = state_of(*saved);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      quantize(effective(to, sizes[i]), expected[i].m, expected[i].v);
    }
    check_same_state(state_of(*loaded), expected);
    if (from == adam_state_dtype::int8 && to == adam_state_dtype::f32) {
      check_same_state(state_of(*loaded), state_of(*saved));  // exact: fp32 holds int8's values
    }
  }
}

TEST_CASE("checkpoint v3: corrupted and non-finite files are refused, the state untouched",
          "[adam][checkpoint]") {
  auto gen = test::rng(3804);
  rig r;
  for (adam_state_dtype dtype : {adam_state_dtype::int8, adam_state_dtype::f32}) {
    INFO(to_string(dtype));
    const std::vector<std::size_t> sizes = random_sizes(gen);
    std::vector<host_param> params = params_of(sizes, gen);
    auto opt = optimizer(r, params, dtype, 1024, random_hyper(gen));
    step_with_fresh_grads(*opt, params, gen, 2);
    const auto good = r.dir.path() / "good.tfck";
    opt->save(good);
    step_with_fresh_grads(*opt, params, gen, 1);  // the live state differs from the file
    const std::vector<param_state_copy> before = state_of(*opt);
    const bytes_t bytes = read_all(good);
    int case_number = 0;
    const auto refused = [&](const bytes_t& content, const std::string& words) {
      const auto path = r.dir.path() / ("bad" + std::to_string(case_number++) + ".tfck");
      write_all(path, content);
      INFO(path.filename().string() << ": expecting '" << words << "'");
      try {
        opt->load(path);
        FAIL("loaded");
      } catch (const input_error& e) {
        CHECK_THAT(e.what(), Catch::Contains(words));
        CHECK(e.source() == path.string());
      }
      check_same_state(state_of(*opt), before);
    };
    // The first piece of the first param (sizes[0] > 1024 elements): master, m, v, scales.
    const std::size_t piece_at = payload_offset(bytes);
    const std::size_t count = 1024;
    const std::size_t values = detail::moment_bytes(dtype, count);
    const std::size_t scales = detail::scale_count(dtype, count) * sizeof(float);
    const std::size_t piece_bytes = count * 4 + 2 * values + 2 * scales;
    for (int i = 0; i < 4; ++i) {
      auto spoiled = bytes;
      const std::size_t at = piece_at + gen() % (bytes.size() - 8 - piece_at);
      spoiled[at] = static_cast<unsigned char>(spoiled[at] ^ (1u << (gen() % 8)));
      INFO("flipped byte " << at);
      refused(spoiled, "corrupted payload: CRC32C mismatch");
    }
    for (int i = 0; i < 3; ++i) {
      refused(bytes_t(bytes.begin(), bytes.begin() + static_cast<long>(gen() % bytes.size())),
              "truncated");
    }
    auto bad_dtype = bytes;
    bad_dtype[first_state_dtype_at(bad_dtype)] = 3;
    fix_header_crc(bad_dtype);
    refused(bad_dtype, "corrupted header: state dtype 3");
    // Another valid state dtype: the payload's size no longer fits the header.
    auto other_dtype = bytes;
    other_dtype[first_state_dtype_at(other_dtype)] = 1;
    fix_header_crc(other_dtype);
    refused(other_dtype, "the header says");
    if (dtype == adam_state_dtype::int8) {
      auto bad_pieces = bytes;
      put<std::uint64_t>(bad_pieces, 16, 1000);  // not whole blocks, and sizes[0] > 1000
      fix_header_crc(bad_pieces);
      refused(bad_pieces, "int8 param 'p0' in pieces of 1000 elements");
      // A NaN scale (CRC right): exp_avg decodes to NaN.
      auto nan_scale = bytes;
      put<float>(nan_scale, piece_at + count * 4 + 2 * values,
                 std::numeric_limits<float>::quiet_NaN());
      fix_piece_crc(nan_scale, piece_at, piece_bytes);
      refused(nan_scale, "exp_avg[");
    } else {
      // A NaN exp_avg and a negative exp_avg_sq (CRC right).
      const std::size_t i = gen() % count;
      auto nan_m = bytes;
      put<float>(nan_m, piece_at + count * 4 + i * 4, std::numeric_limits<float>::quiet_NaN());
      fix_piece_crc(nan_m, piece_at, piece_bytes);
      refused(nan_m, "'p0': exp_avg[" + std::to_string(i) + "] is nan (must be finite)");
      auto negative_v = bytes;
      put<float>(negative_v, piece_at + count * 4 + values + i * 4, -1.0f);
      fix_piece_crc(negative_v, piece_at, piece_bytes);
      refused(negative_v, "'p0': exp_avg_sq[" + std::to_string(i) + "] is -1");
    }
    opt->load(good);  // and the good file still loads
  }
}

TEST_CASE("checkpoint v3: a version 2 file with a NaN exp_avg is refused", "[adam][checkpoint]") {
  auto gen = test::rng(3805);
  rig r;
  bytes_t file = read_all(v2_fixture());
  REQUIRE(file.size() > 16);
  // Element i of param 'w''s first piece: master, then exp_avg (fp32, v2_piece each).
  const std::size_t i = gen() % v2_piece;
  const std::size_t piece_at = payload_offset(file);
  put<float>(file, piece_at + (v2_piece + i) * 4, std::numeric_limits<float>::infinity());
  fix_piece_crc(file, piece_at, 3 * v2_piece * 4);
  const auto path = r.dir.path() / "v2_inf.tfck";
  write_all(path, file);
  v2_optimizer live = v2_shaped(r, adam_state_dtype::f32, gen);
  const std::vector<param_state_copy> before = state_of(*live.opt);
  CHECK_THROWS_WITH(live.opt->load(path),
                    Catch::Contains("'w': exp_avg[" + std::to_string(i) + "] is inf"));
  check_same_state(state_of(*live.opt), before);
}
