// Layout (little-endian), version 2:
//   "TFADAMCK"  u32 version  u32 header_bytes  header  u32 crc32c(everything before it)
//   header: u64 piece_elements, u32 groups, then per group: f64 lr, beta1, beta2, eps,
//           weight_decay; u8 decay (0 decoupled, 1 l2); u8 bias_correction; u64 steps;
//           u32 params, then per param: u16 name bytes, name, u8 dtype (0 f32, 1 bf16, 2 f16),
//           u64 elements, u64 steps (the param's own; version 2 only: in version 1 files
//           every param has its group's steps)
//   payload: per group, per param, per piece of piece_elements: master, exp_avg, exp_avg_sq
//           (f32 each), u32 crc32c of the piece
//   "TFADEND!"
#include "optim/adam_checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include "core/crc32c.hpp"
#include "core/durable_file.hpp"
#include "tierflow/error.hpp"

namespace tierflow::detail {

namespace {

constexpr char magic[8] = {'T', 'F', 'A', 'D', 'A', 'M', 'C', 'K'};
constexpr char end_magic[8] = {'T', 'F', 'A', 'D', 'E', 'N', 'D', '!'};
constexpr std::uint32_t format_version = 2;
constexpr std::uint32_t oldest_version = 1;  // still read
constexpr std::uint32_t max_header_bytes = 64u << 20;
constexpr std::size_t io_block = std::size_t{1} << 20;

static_assert(std::endian::native == std::endian::little, "the checkpoint format is little-endian");

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

struct saved_param {
  std::string name;
  param_dtype dtype = param_dtype::f32;
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

// One param's record; adds its payload bytes (state + piece CRCs) to @p payload.
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
  const std::uint64_t pieces = (p.elements + piece_elements - 1) / piece_elements;
  payload += 12 * p.elements + 4 * pieces;
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

// Reads every piece in order, checking its CRC; with @p into, also copies it into the state.
void walk_payload(checkpoint_file& file, const saved_header& h, std::vector<group_state>* into) {
  std::vector<unsigned char> block(io_block);
  std::uint64_t at = h.payload_offset;
  for (std::size_t gi = 0; gi < h.groups.size(); ++gi) {
    for (std::size_t pi = 0; pi < h.groups[gi].params.size(); ++pi) {
      const std::uint64_t elements = h.groups[gi].params[pi].elements;
      for (std::uint64_t off = 0; off < elements; off += h.piece_elements) {
        const std::uint64_t count = std::min<std::uint64_t>(h.piece_elements, elements - off);
        std::uint32_t crc = 0;
        for (int array = 0; array < 3; ++array) {  // master, exp_avg, exp_avg_sq
          float* dst = nullptr;
          if (into != nullptr) {
            const param_state& p = (*into)[gi].params[pi];
            float* base = array == 0 ? p.master_p() : array == 1 ? p.moments_m() : p.moments_v();
            dst = base + off;
          }
          std::uint64_t left = count * sizeof(float);
          std::uint64_t done = 0;
          while (left > 0) {
            const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, io_block));
            file.read_at(at, block.data(), n, "the payload");
            crc = crc32c(block.data(), n, crc);
            if (dst != nullptr) {
              std::memcpy(reinterpret_cast<unsigned char*>(dst) + done, block.data(), n);
            }
            at += n;
            done += n;
            left -= n;
          }
        }
        std::uint32_t stored = 0;
        file.read_at(at, &stored, 4, "a piece CRC");
        at += 4;
        if (stored != crc) {
          throw input_error(file.path(), "corrupted payload: CRC32C mismatch in param '" +
                                             h.groups[gi].params[pi].name + "' at element " +
                                             std::to_string(off));
        }
      }
    }
  }
  char tail[sizeof end_magic];
  file.read_at(at, tail, sizeof tail, "the end marker");
  if (std::memcmp(tail, end_magic, sizeof tail) != 0) {
    throw input_error(file.path(), "corrupted end marker");
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
      h.put<std::uint16_t>(static_cast<std::uint16_t>(p.desc.name.size()));
      h.put_bytes(p.desc.name);
      h.put<std::uint8_t>(static_cast<std::uint8_t>(p.desc.dtype));
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
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      for (std::size_t off = 0; off < p.desc.elements; off += piece_elements) {
        const std::size_t bytes = std::min(piece_elements, p.desc.elements - off) * sizeof(float);
        std::uint32_t crc = 0;
        for (const float* base : {p.master_p(), p.moments_m(), p.moments_v()}) {
          out.write(base + off, bytes);
          crc = crc32c(base + off, bytes, crc);
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
  walk_payload(file, h, nullptr);  // every byte checks out before anything changes
  walk_payload(file, h, &groups);
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    groups[gi].hyper = h.groups[gi].hyper;
    groups[gi].steps = h.groups[gi].steps;
    for (std::size_t pi = 0; pi < groups[gi].params.size(); ++pi) {
      groups[gi].params[pi].steps = h.groups[gi].params[pi].steps;
    }
  }
}

}  // namespace tierflow::detail
