// Layout (little-endian), version 3:
//   "TFADAMCK"  u32 version  u32 header_bytes  header  u32 crc32c(everything before it)
//   header: u64 piece_elements, u32 groups, then per group: f64 lr, beta1, beta2, eps,
//           weight_decay; u8 decay (0 decoupled, 1 l2); u8 bias_correction; u64 steps;
//           u32 params, then per param: u16 name bytes, name, u8 dtype (0 f32, 1 bf16, 2 f16),
//           u8 state dtype (0 f32, 1 bf16, 2 int8; version 3 only: older files hold f32),
//           u64 elements, u64 steps (the param's own; versions 2 and 3: in version 1 files
//           every param has its group's steps)
//   payload: per group, per param, per piece of piece_elements (the last one shorter): the
//           master (count f32), then the piece's moments exactly as stored
//           (tierflow/detail/adam_state.hpp, state_pieces order): exp_avg's values, exp_avg_sq's
//           values, and for int8 exp_avg's then exp_avg_sq's scales of the piece's blocks
//           (an int8 param of more than one piece has piece_elements a multiple of
//           state_block); then u32 crc32c of the piece. f32 moments are the bytes of versions 1
//           and 2 (master, exp_avg, exp_avg_sq).
//   "TFADEND!"
// Loading copies moments of the live state dtype as they are, and converts others through
// fp32 (decode, then encode the whole param).
#include "optim/adam_checkpoint.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include "core/crc32c.hpp"
#include "core/durable_file.hpp"
#include "optim/adam_core.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/error.hpp"

namespace tierflow::detail {

namespace {

constexpr char magic[8] = {'T', 'F', 'A', 'D', 'A', 'M', 'C', 'K'};
constexpr char end_magic[8] = {'T', 'F', 'A', 'D', 'E', 'N', 'D', '!'};
constexpr std::uint32_t format_version = 3;
constexpr std::uint32_t oldest_version = 1;  // still read
constexpr std::uint32_t max_header_bytes = 64u << 20;
constexpr std::size_t io_block = std::size_t{1} << 20;
// Elements of moments decoded at a time (whole int8 blocks).
constexpr std::size_t decode_window = 64 * state_block;
// More payload than any file holds; a header's sum stops here, before it could wrap.
constexpr std::uint64_t max_payload = std::uint64_t{1} << 62;

static_assert(std::endian::native == std::endian::little, "the checkpoint format is little-endian");
static_assert(decode_window % state_block == 0);

class header_writer {
 public:
  template <typename T>
  void put(T value) {
    const auto* p = reinterpret_cast<const unsigned char*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof value);
  }
  void put_bytes(const std::string& s) { bytes.insert(bytes.end(), s.begin(), s.end()); }
  std::vector<unsigned char> bytes;
};

class header_reader {
 public:
  header_reader(const std::vector<unsigned char>& bytes, const std::string& path)
      : bytes_(bytes), path_(path) {}
  template <typename T>
  T get(const char* what) {
    T value{};
    need(sizeof value, what);
    std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  std::string get_string(std::size_t n, const char* what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  [[nodiscard]] bool done() const noexcept { return at_ == bytes_.size(); }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  void need(std::size_t n, const char* what) const {
    if (bytes_.size() - at_ < n) {
      throw input_error(path_, std::string("header ends inside ") + what);
    }
  }
  const std::vector<unsigned char>& bytes_;
  const std::string& path_;
  std::size_t at_ = 0;
};

// A file read in order with clear errors.
class checkpoint_file {
 public:
  // No size bound here: the header says how long the file must be and read_header checks it.
  explicit checkpoint_file(const std::filesystem::path& path)
      : file_(path, "checkpoint", std::numeric_limits<std::uint64_t>::max()) {}

  void read_at(std::uint64_t offset, void* out, std::size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got =
          ::pread(file_.fd(), p + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) {
        continue;
      }
      if (got < 0) {
        throw input_error(path(),
                          std::string("read failed in ") + what + ": " + std::strerror(errno));
      }
      if (got == 0) {
        throw input_error(path(), std::string("truncated: the file ends inside ") + what);
      }
      done += static_cast<std::size_t>(got);
    }
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return file_.size(); }
  [[nodiscard]] const std::string& path() const noexcept { return file_.source(); }

 private:
  input_file file_;
};

struct saved_param {
  std::string name;
  param_dtype dtype = param_dtype::f32;
  adam_state_dtype state_dtype = adam_state_dtype::f32;
  std::uint64_t elements = 0;
  std::uint64_t steps = 0;
};

struct saved_group {
  adam_hyper hyper;
  std::uint64_t steps = 0;
  std::vector<saved_param> params;
};

struct saved_header {
  std::uint64_t piece_elements = 0;
  std::vector<saved_group> groups;
  std::uint64_t payload_offset = 0;
  std::uint64_t file_bytes = 0;  // what the header implies
};

// The byte spans of a piece of @p count elements, in file order: master, exp_avg's values,
// exp_avg_sq's values, exp_avg's scales, exp_avg_sq's scales (the CRC follows).
std::array<std::uint64_t, 5> piece_sections(adam_state_dtype dtype, std::uint64_t count) {
  const std::uint64_t values = moment_bytes(dtype, count);
  const std::uint64_t scales = scale_count(dtype, count) * sizeof(float);
  return {count * sizeof(float), values, values, scales, scales};
}

// Bytes of a piece of @p count elements in the file, its CRC included.
std::uint64_t piece_bytes(adam_state_dtype dtype, std::uint64_t count) {
  return count * sizeof(float) + packed_moments_bytes(dtype, count) + sizeof(std::uint32_t);
}

// One param's record; adds its payload bytes (pieces and their CRCs) to @p payload.
saved_param read_param(header_reader& in, const saved_group& g, std::uint32_t version,
                       std::uint64_t piece_elements, std::uint64_t& payload) {
  const std::string& path = in.path();
  saved_param p;
  const auto name_bytes = in.get<std::uint16_t>("a name length");
  p.name = in.get_string(name_bytes, "a name");
  const auto dtype = in.get<std::uint8_t>("a dtype");
  if (dtype > 2) {
    throw input_error(path, "corrupted header: dtype " + std::to_string(dtype));
  }
  p.dtype = static_cast<param_dtype>(dtype);
  if (version >= 3) {
    const auto state = in.get<std::uint8_t>("a state dtype");
    if (state > 2) {
      throw input_error(path, "corrupted header: state dtype " + std::to_string(state));
    }
    p.state_dtype = static_cast<adam_state_dtype>(state);
  }
  p.elements = in.get<std::uint64_t>("an element count");
  p.steps = version >= 2 ? in.get<std::uint64_t>("a param's step count") : g.steps;
  if (p.steps > g.steps) {
    throw input_error(path, "corrupted header: param '" + p.name + "' has " +
                                std::to_string(p.steps) + " steps, its group " +
                                std::to_string(g.steps));
  }
  if (p.elements == 0 || p.elements > (std::uint64_t{1} << 48)) {
    throw input_error(path, "corrupted header: param '" + p.name + "' has " +
                                std::to_string(p.elements) + " elements");
  }
  // A piece of int8 moments holds whole blocks, else its scales are another piece's too.
  if (p.state_dtype == adam_state_dtype::int8 && p.elements > piece_elements &&
      piece_elements % state_block != 0) {
    throw input_error(path, "corrupted header: int8 param '" + p.name + "' in pieces of " +
                                std::to_string(piece_elements) + " elements (not whole blocks of " +
                                std::to_string(state_block) + ")");
  }
  // In closed form: a corrupted header may claim 2^48 pieces.
  const std::uint64_t full = p.elements / piece_elements;
  const std::uint64_t last = p.elements % piece_elements;
  payload += (full > 0 ? full * piece_bytes(p.state_dtype, piece_elements) : 0) +
             (last > 0 ? piece_bytes(p.state_dtype, last) : 0);
  if (payload > max_payload) {
    throw input_error(path, "corrupted header: the params hold more than 2^62 bytes");
  }
  return p;
}

// Group @p gi's record: its hyper-parameters, step count and params.
saved_group read_group(header_reader& in, std::uint32_t gi, std::uint32_t version,
                       std::uint64_t piece_elements, std::uint64_t& payload) {
  const std::string& path = in.path();
  saved_group g;
  g.hyper.lr = in.get<double>("lr");
  g.hyper.beta1 = in.get<double>("beta1");
  g.hyper.beta2 = in.get<double>("beta2");
  g.hyper.eps = in.get<double>("eps");
  g.hyper.weight_decay = in.get<double>("weight_decay");
  const auto decay = in.get<std::uint8_t>("the decay mode");
  if (decay > 1) {
    throw input_error(path, "corrupted header: decay mode " + std::to_string(decay));
  }
  g.hyper.decay = decay == 0 ? weight_decay_mode::decoupled : weight_decay_mode::l2;
  g.hyper.bias_correction = in.get<std::uint8_t>("bias_correction") != 0;
  g.steps = in.get<std::uint64_t>("the step count");
  try {
    check_hyper(g.hyper, "group " + std::to_string(gi));
  } catch (const error& e) {
    throw input_error(path, std::string("bad hyper-parameters: ") + e.what());
  }
  const auto params = in.get<std::uint32_t>("the param count");
  for (std::uint32_t pi = 0; pi < params; ++pi) {
    g.params.push_back(read_param(in, g, version, piece_elements, payload));
  }
  return g;
}

saved_header read_header(checkpoint_file& file) {
  const std::string& path = file.path();
  char head[16];
  if (file.size() < sizeof head) {
    throw input_error(path, "truncated: too short for a tierflow Adam checkpoint");
  }
  file.read_at(0, head, sizeof head, "the magic");
  if (std::memcmp(head, magic, sizeof magic) != 0) {
    throw input_error(path, "not a tierflow Adam checkpoint (bad magic)");
  }
  std::uint32_t version = 0;
  std::uint32_t header_bytes = 0;
  std::memcpy(&version, head + 8, 4);
  std::memcpy(&header_bytes, head + 12, 4);
  if (version < oldest_version || version > format_version) {
    throw input_error(path, "checkpoint format version " + std::to_string(version) +
                                " is not supported (this build reads versions " +
                                std::to_string(oldest_version) + " to " +
                                std::to_string(format_version) + ")");
  }
  if (header_bytes > max_header_bytes || 16 + std::uint64_t{header_bytes} + 4 > file.size()) {
    throw input_error(
        path, "truncated or corrupted header (length " + std::to_string(header_bytes) + ")");
  }
  std::vector<unsigned char> bytes(header_bytes);
  file.read_at(16, bytes.data(), bytes.size(), "the header");
  std::uint32_t stored_crc = 0;
  file.read_at(16 + header_bytes, &stored_crc, 4, "the header CRC");
  if (crc32c(bytes.data(), bytes.size(), crc32c(head, sizeof head)) != stored_crc) {
    throw input_error(path, "corrupted header (CRC32C mismatch)");
  }
  header_reader in(bytes, path);
  saved_header h;
  h.piece_elements = in.get<std::uint64_t>("piece_elements");
  if (h.piece_elements == 0) {
    throw input_error(path, "corrupted header: piece_elements is 0");
  }
  const auto groups = in.get<std::uint32_t>("the group count");
  std::uint64_t payload = 0;
  for (std::uint32_t gi = 0; gi < groups; ++gi) {
    h.groups.push_back(read_group(in, gi, version, h.piece_elements, payload));
  }
  if (!in.done()) {
    throw input_error(path, "corrupted header: bytes left after the last parameter");
  }
  h.payload_offset = 16 + std::uint64_t{header_bytes} + 4;
  h.file_bytes = h.payload_offset + payload + sizeof end_magic;
  if (file.size() != h.file_bytes) {
    throw input_error(path, (file.size() < h.file_bytes ? "truncated: " : "trailing bytes: ") +
                                std::to_string(file.size()) + " bytes, the header says " +
                                std::to_string(h.file_bytes));
  }
  return h;
}

// Shapes must match the live optimizer's exactly.
void check_shapes(const saved_header& h, const std::vector<group_state>& groups,
                  const std::string& path) {
  if (h.groups.size() != groups.size()) {
    throw input_error(path, "the checkpoint has " + std::to_string(h.groups.size()) +
                                " parameter groups, this optimizer " +
                                std::to_string(groups.size()));
  }
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& saved = h.groups[gi].params;
    const auto& live = groups[gi].params;
    if (saved.size() != live.size()) {
      throw input_error(path, "group " + std::to_string(gi) + " has " +
                                  std::to_string(saved.size()) + " params in the checkpoint, " +
                                  std::to_string(live.size()) + " here");
    }
    for (std::size_t pi = 0; pi < live.size(); ++pi) {
      const auto& s = saved[pi];
      const auto& l = live[pi].desc;
      if (s.name != l.name || s.dtype != l.dtype || s.elements != l.elements) {
        throw input_error(path, "group " + std::to_string(gi) + " param " + std::to_string(pi) +
                                    " is '" + s.name + "' " + std::string(to_string(s.dtype)) +
                                    " × " + std::to_string(s.elements) + " in the checkpoint, '" +
                                    l.name + "' " + std::string(to_string(l.dtype)) + " × " +
                                    std::to_string(l.elements) + " here");
      }
    }
  }
}

// Streams @p bytes of the file from @p at (advanced past them) through the CRC @p crc,
// copying them to @p dst unless it is null.
std::uint32_t stream_bytes(checkpoint_file& file, std::uint64_t& at, std::uint64_t bytes,
                           unsigned char* dst, std::uint32_t crc,
                           std::vector<unsigned char>& block) {
  for (std::uint64_t done = 0; done < bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes - done, io_block));
    file.read_at(at, block.data(), n, "the payload");
    crc = crc32c(block.data(), n, crc);
    if (dst != nullptr) {
      std::memcpy(dst + done, block.data(), n);
    }
    at += n;
    done += n;
  }
  return crc;
}

// Reads the piece at @p at (advanced past it and its CRC) of param @p s from element @p off,
// copying each section to its destination in @p into (null: not copied), and checks its CRC.
void read_piece(checkpoint_file& file, std::uint64_t& at, const saved_param& s, std::uint64_t off,
                const std::array<std::uint64_t, 5>& sections,
                const std::array<unsigned char*, 5>& into, std::vector<unsigned char>& block) {
  std::uint32_t crc = 0;
  for (std::size_t i = 0; i < sections.size(); ++i) {
    crc = stream_bytes(file, at, sections[i], into[i], crc, block);
  }
  std::uint32_t stored = 0;
  file.read_at(at, &stored, 4, "a piece CRC");
  at += 4;
  if (stored != crc) {
    throw input_error(file.path(), "corrupted payload: CRC32C mismatch in param '" + s.name +
                                       "' at element " + std::to_string(off));
  }
}

// Room for a window of a piece's moments as the file stores them.
struct moments_window {
  std::vector<unsigned char> m, v;
  std::vector<float> m_scale, v_scale;
};

// Decodes elements [first, first + n) of a piece's moments (@p count elements of @p dtype whose
// moments start at @p at; @p first a multiple of state_block) into @p m and @p v.
void decode_from_file(checkpoint_file& file, std::uint64_t at, adam_state_dtype dtype,
                      std::uint64_t count, std::uint64_t first, std::size_t n, moments_window& w,
                      float* m, float* v) {
  const std::array<std::uint64_t, 5> sections = piece_sections(dtype, count);
  w.m.resize(moment_bytes(dtype, n));
  w.v.resize(w.m.size());
  w.m_scale.resize(scale_count(dtype, n));
  w.v_scale.resize(w.m_scale.size());
  const std::uint64_t values_at = moment_bytes(dtype, first);
  const std::uint64_t scales_at = scale_count(dtype, first) * sizeof(float);
  file.read_at(at + values_at, w.m.data(), w.m.size(), "the payload");
  file.read_at(at + sections[1] + values_at, w.v.data(), w.v.size(), "the payload");
  const std::size_t scale_bytes = w.m_scale.size() * sizeof(float);
  if (scale_bytes > 0) {
    file.read_at(at + 2 * sections[1] + scales_at, w.m_scale.data(), scale_bytes, "the payload");
    file.read_at(at + 2 * sections[1] + sections[3] + scales_at, w.v_scale.data(), scale_bytes,
                 "the payload");
  }
  decode_moments({dtype, w.m.data(), w.v.data(), w.m_scale.data(), w.v_scale.data()}, 0, n, m, v);
}

// Refuses a piece whose moments decode to what set_state refuses: a value that is not
// finite, or a negative exp_avg_sq.
void check_moments(checkpoint_file& file, std::uint64_t at, const saved_param& s, std::uint64_t off,
                   std::uint64_t count, moments_window& w, std::vector<float>& m,
                   std::vector<float>& v) {
  for (std::uint64_t first = 0; first < count; first += decode_window) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(decode_window, count - first));
    decode_from_file(file, at, s.state_dtype, count, first, n, w, m.data(), v.data());
    for (std::size_t i = 0; i < n; ++i) {
      const bool bad_m = !std::isfinite(m[i]);
      if (bad_m || !std::isfinite(v[i]) || v[i] < 0) {
        throw input_error(file.path(),
                          "param '" + s.name + "': " + (bad_m ? "exp_avg" : "exp_avg_sq") + "[" +
                              std::to_string(off + first + i) + "] is " +
                              number(bad_m ? m[i] : v[i]) +
                              (bad_m ? " (must be finite)" : " (must be finite and >= 0)"));
      }
    }
  }
}

// The first walk: every piece's CRC and moments, and the end marker. Changes nothing.
void check_payload(checkpoint_file& file, const saved_header& h) {
  std::vector<unsigned char> block(io_block);
  moments_window w;
  std::vector<float> m(decode_window);
  std::vector<float> v(decode_window);
  std::uint64_t at = h.payload_offset;
  for (const saved_group& g : h.groups) {
    for (const saved_param& s : g.params) {
      for (std::uint64_t off = 0; off < s.elements; off += h.piece_elements) {
        const std::uint64_t count = std::min<std::uint64_t>(h.piece_elements, s.elements - off);
        const std::array<std::uint64_t, 5> sections = piece_sections(s.state_dtype, count);
        const std::uint64_t moments_at = at + sections[0];
        read_piece(file, at, s, off, sections, {}, block);
        check_moments(file, moments_at, s, off, count, w, m, v);
      }
    }
  }
  char tail[sizeof end_magic];
  file.read_at(at, tail, sizeof tail, "the end marker");
  if (std::memcmp(tail, end_magic, sizeof tail) != 0) {
    throw input_error(file.path(), "corrupted end marker");
  }
}

// Loads one param's pieces from @p at (advanced past them): moments of the live dtype as they
// are, others decoded into @p m and @p v (whole-param room) and encoded into the live dtype.
void load_param(checkpoint_file& file, std::uint64_t& at, const saved_param& s,
                std::uint64_t piece_elements, const param_state& live,
                std::vector<unsigned char>& block, std::vector<float>& m, std::vector<float>& v) {
  const bool convert = s.state_dtype != live.state_dtype();
  moments_window w;
  std::vector<float> split;  // a split master's piece, read whole, then split
  for (std::uint64_t off = 0; off < s.elements; off += piece_elements) {
    const std::uint64_t count = std::min<std::uint64_t>(piece_elements, s.elements - off);
    const std::array<std::uint64_t, 5> sections = piece_sections(s.state_dtype, count);
    if (live.master_split()) {
      split.resize(count);
    }
    std::array<unsigned char*, 5> into{reinterpret_cast<unsigned char*>(
        live.master_split() ? split.data() : live.master_p() + off)};
    if (!convert) {
      const state_piece_list pieces = state_pieces(live.moments_at, live.desc.elements, off, count);
      for (std::size_t i = 0; i < pieces.count; ++i) {
        into[i + 1] = pieces.items[i].at;
      }
    }
    const std::uint64_t moments_at = at + sections[0];
    read_piece(file, at, s, off, sections, into, block);
    if (live.master_split()) {
      write_master(live, off, count, split.data());
    }
    for (std::uint64_t first = 0; convert && first < count; first += decode_window) {
      const auto n =
          static_cast<std::size_t>(std::min<std::uint64_t>(decode_window, count - first));
      decode_from_file(file, moments_at, s.state_dtype, count, first, n, w, m.data() + off + first,
                       v.data() + off + first);
    }
  }
  if (convert) {
    // Whole blocks: the live int8 scales cover the whole param at once.
    encode_moments(best_kernel(), live.moments_at, 0, live.desc.elements, m.data(), v.data());
  }
}

// The second walk: the state from the file (every byte already checked by check_payload).
void load_payload(checkpoint_file& file, const saved_header& h, std::vector<group_state>& groups) {
  // Room to convert the largest param, taken before anything changes.
  std::size_t widest = 0;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    for (std::size_t pi = 0; pi < groups[gi].params.size(); ++pi) {
      const param_state& live = groups[gi].params[pi];
      if (h.groups[gi].params[pi].state_dtype != live.state_dtype()) {
        widest = std::max(widest, live.desc.elements);
      }
    }
  }
  std::vector<float> m(widest);
  std::vector<float> v(widest);
  std::vector<unsigned char> block(io_block);
  std::uint64_t at = h.payload_offset;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    for (std::size_t pi = 0; pi < groups[gi].params.size(); ++pi) {
      load_param(file, at, h.groups[gi].params[pi], h.piece_elements, groups[gi].params[pi], block,
                 m, v);
    }
  }
}

}  // namespace

void save_checkpoint(const std::filesystem::path& path, const std::vector<group_state>& groups,
                     std::size_t piece_elements) {
  header_writer h;
  h.put<std::uint64_t>(piece_elements);
  h.put<std::uint32_t>(static_cast<std::uint32_t>(groups.size()));
  for (const auto& g : groups) {
    h.put<double>(g.hyper.lr);
    h.put<double>(g.hyper.beta1);
    h.put<double>(g.hyper.beta2);
    h.put<double>(g.hyper.eps);
    h.put<double>(g.hyper.weight_decay);
    h.put<std::uint8_t>(g.hyper.decay == weight_decay_mode::decoupled ? 0 : 1);
    h.put<std::uint8_t>(g.hyper.bias_correction ? 1 : 0);
    h.put<std::uint64_t>(g.steps);
    h.put<std::uint32_t>(static_cast<std::uint32_t>(g.params.size()));
    for (const auto& p : g.params) {
      TIERFLOW_EXPECTS(p.desc.name.size() <= 0xffff, "a parameter name is too long to save");
      TIERFLOW_EXPECTS(p.state_dtype() != adam_state_dtype::int8 ||
                           p.desc.elements <= piece_elements || piece_elements % state_block == 0,
                       "int8 moments are saved in pieces of whole blocks");
      h.put<std::uint16_t>(static_cast<std::uint16_t>(p.desc.name.size()));
      h.put_bytes(p.desc.name);
      h.put<std::uint8_t>(static_cast<std::uint8_t>(p.desc.dtype));
      h.put<std::uint8_t>(static_cast<std::uint8_t>(p.state_dtype()));
      h.put<std::uint64_t>(p.desc.elements);
      h.put<std::uint64_t>(p.steps);
    }
  }
  unsigned char head[16];
  std::memcpy(head, magic, 8);
  const std::uint32_t version = format_version;
  const auto header_bytes = static_cast<std::uint32_t>(h.bytes.size());
  std::memcpy(head + 8, &version, 4);
  std::memcpy(head + 12, &header_bytes, 4);
  const std::uint32_t header_crc = crc32c(h.bytes.data(), h.bytes.size(), crc32c(head, 16));

  durable_writer out(path, "checkpoint");
  out.write(head, sizeof head);
  out.write(h.bytes.data(), h.bytes.size());
  out.write(&header_crc, 4);
  std::vector<float> joined;  // a split master's piece as fp32
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      for (std::size_t off = 0; off < p.desc.elements; off += piece_elements) {
        const std::size_t count = std::min(piece_elements, p.desc.elements - off);
        const std::size_t master_bytes = count * sizeof(float);
        if (p.master_split()) {
          joined.resize(count);
          read_master(p, off, count, joined.data());
        }
        const float* master = p.master_split() ? joined.data() : p.master_p() + off;
        out.write(master, master_bytes);
        std::uint32_t crc = crc32c(master, master_bytes);
        for (const state_piece& s : state_pieces(p.moments_at, p.desc.elements, off, count)) {
          out.write(s.at, s.bytes);
          crc = crc32c(s.at, s.bytes, crc);
        }
        out.write(&crc, 4);
      }
    }
  }
  out.write(end_magic, sizeof end_magic);
  out.commit();
}

void load_checkpoint(const std::filesystem::path& path, std::vector<group_state>& groups) {
  checkpoint_file file(path);
  const saved_header h = read_header(file);
  check_shapes(h, groups, file.path());
  check_payload(file, h);  // every byte checks out before anything changes
  load_payload(file, h, groups);
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    groups[gi].hyper = h.groups[gi].hyper;
    groups[gi].steps = h.groups[gi].steps;
    for (std::size_t pi = 0; pi < groups[gi].params.size(); ++pi) {
      groups[gi].params[pi].steps = h.groups[gi].params[pi].steps;
    }
  }
}

}  // namespace tierflow::detail
