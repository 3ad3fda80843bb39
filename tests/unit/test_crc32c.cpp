#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/crc32c.hpp"
#include "core/durable_file.hpp"
#include "test_support.hpp"
#include "tierflow/error.hpp"

using tierflow::detail::crc32c;
using tierflow::detail::crc32c_software;
using tierflow::detail::durable_writer;

namespace {

using crc_function = std::uint32_t (*)(const void*, std::size_t, std::uint32_t) noexcept;

// crc32c() takes the hardware path where the CPU has one; both must give the same answers.
struct crc_path {
  const char* name;
  crc_function crc;
};
const crc_path crc_paths[] = {{"dispatched", &crc32c}, {"software", &crc32c_software}};

std::uint32_t crc_of(const crc_path& path, const std::vector<unsigned char>& bytes) {
  return path.crc(bytes.data(), bytes.size(), 0);
}

// An oracle that does not share code with durable_file.cpp.
std::vector<unsigned char> slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out);
}

std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("crc32c gives the published check values on both paths", "[checkpoint]") {
  std::vector<unsigned char> ascending(32);
  std::vector<unsigned char> descending(32);
  for (std::size_t i = 0; i < 32; ++i) {
    ascending[i] = static_cast<unsigned char>(i);
    descending[i] = static_cast<unsigned char>(31 - i);
  }
  const std::string digits = "123456789";
  for (const auto& path : crc_paths) {
    INFO(path.name);
    CHECK(path.crc(digits.data(), digits.size(), 0) == 0xE3069283u);
    // RFC 3720 (iSCSI), appendix B.4.
    CHECK(crc_of(path, std::vector<unsigned char>(32, 0x00)) == 0x8A9136AAu);
    CHECK(crc_of(path, std::vector<unsigned char>(32, 0xFF)) == 0x62A8AB43u);
    CHECK(crc_of(path, ascending) == 0x46DD794Eu);
    CHECK(crc_of(path, descending) == 0x113FDB5Cu);
    // Nothing in, nothing changed: the empty input, and chaining an empty piece.
    CHECK(path.crc(nullptr, 0, 0) == 0u);
    CHECK(path.crc(nullptr, 0, 0xE3069283u) == 0xE3069283u);
  }
}

TEST_CASE("crc32c hardware and software paths agree on random buffers", "[checkpoint]") {
  auto gen = tierflow::test::rng(301);
  std::vector<std::size_t> lengths;
  for (int round = 0; round < 300; ++round) {
    lengths.push_back(std::uniform_int_distribution<std::size_t>(0, 10000)(gen));
  }
  // Around multiples of 1 KiB, where the hardware path's interleaved rounds start and end,
  // and one long buffer of many rounds.
  for (std::size_t k = 1; k <= 9; ++k) {
    for (const int delta : {-9, -8, -1, 0, 1, 7, 8}) {
      lengths.push_back(static_cast<std::size_t>(static_cast<long>(k * 1024) + delta));
    }
  }
  lengths.push_back((std::size_t{1} << 20) + 13);

  for (const std::size_t length : lengths) {
    const auto offset = std::uniform_int_distribution<std::size_t>(0, 15)(gen);
    const auto buffer = tierflow::test::random_bytes(length + 16, gen);
    const unsigned char* data = buffer.data() + offset;
    INFO("length " << length << " at offset " << offset);
    const std::uint32_t whole = crc32c_software(data, length);
    REQUIRE(crc32c(data, length) == whole);

    const auto split = std::uniform_int_distribution<std::size_t>(0, length)(gen);
    INFO("split at " << split);
    for (const auto& path : crc_paths) {
      INFO(path.name);
      CHECK(path.crc(data + split, length - split, path.crc(data, split, 0)) == whole);
    }
  }
}

TEST_CASE("crc32c changes when one bit flips", "[checkpoint]") {
  auto gen = tierflow::test::rng(302);
  for (int round = 0; round < 200; ++round) {
    const auto length = std::uniform_int_distribution<std::size_t>(1, 10000)(gen);
    auto bytes = tierflow::test::random_bytes(length, gen);
    const std::uint32_t before = crc32c(bytes.data(), bytes.size());
    const auto at = std::uniform_int_distribution<std::size_t>(0, length - 1)(gen);
    const auto bit = std::uniform_int_distribution<int>(0, 7)(gen);
    bytes[at] = static_cast<unsigned char>(bytes[at] ^ (1u << bit));
    INFO("length " << length << ", bit " << bit << " of byte " << at);
    for (const auto& path : crc_paths) {
      INFO(path.name);
      CHECK(crc_of(path, bytes) != before);
    }
  }
}

TEST_CASE("durable_writer puts the whole file in place on commit", "[checkpoint]") {
  auto gen = tierflow::test::rng(303);
  const tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "state.tfck";
  spit(path, {1, 2, 3});  // an older file to replace

  for (int round = 0; round < 5; ++round) {
    const auto length = std::uniform_int_distribution<std::size_t>(0, 200000)(gen);
    const auto bytes = tierflow::test::random_bytes(length, gen);
    {
      durable_writer out(path, "checkpoint");
      CHECK(out.path() == path);
      // Pieces of random sizes, empty ones included.
      std::size_t done = 0;
      while (done < length) {
        const auto piece =
            std::min(length - done, std::uniform_int_distribution<std::size_t>(0, 70000)(gen));
        out.write(bytes.data() + done, piece);
        done += piece;
      }
      // Until the commit, the bytes live in a temp file beside the target.
      const auto names = names_in(dir.path());
      REQUIRE(names.size() == 2);
      CHECK(names[0] == "state.tfck");
      CHECK(names[1].rfind("state.tfck.tmp.", 0) == 0);
      CHECK(slurp(path) != bytes);
      out.commit();
    }
    INFO("round " << round << ", " << length << " bytes");
    CHECK(slurp(path) == bytes);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"state.tfck"});
  }
}

TEST_CASE("durable_writer without commit leaves the old file alone", "[checkpoint]") {
  auto gen = tierflow::test::rng(304);
  const tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "state.tfck";
  const auto old_bytes = tierflow::test::random_bytes(5000, gen);
  spit(path, old_bytes);
  {
    durable_writer out(path, "checkpoint");
    const auto new_bytes = tierflow::test::random_bytes(7000, gen);
    out.write(new_bytes.data(), new_bytes.size());
  }
  CHECK(slurp(path) == old_bytes);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"state.tfck"});

  // The same when there was no old file: nothing is left behind.
  const auto fresh = dir.path() / "fresh.tfck";
  { durable_writer out(fresh, "checkpoint"); }
  CHECK_FALSE(std::filesystem::exists(fresh));
  CHECK(names_in(dir.path()) == std::vector<std::string>{"state.tfck"});
}

TEST_CASE("durable_writer errors name the file", "[checkpoint]") {
  const tierflow::test::scratch_dir dir;

  const auto nowhere = dir.path() / "no-such-dir" / "state.tfck";
  // A folder that is not there is bad input naming it, not the system's refusal.
  CHECK_THROWS_AS(durable_writer(nowhere, "checkpoint"), tierflow::input_error);
  CHECK_THROWS_WITH(durable_writer(nowhere, "checkpoint"),
                    Catch::StartsWith(nowhere.string() +
                                      ": the folder of the checkpoint does "
                                      "not exist: '" +
                                      nowhere.parent_path().string() + "'"));
  // The system's refusal: environment_error with the errno (docs/errors.md).
  const auto in_sys = std::filesystem::path("/sys") / "tierflow-test-state.tfck";
  CHECK_THROWS_AS(durable_writer(in_sys, "checkpoint"), tierflow::environment_error);
  CHECK_THROWS_WITH(
      durable_writer(in_sys, "checkpoint"),
      Catch::StartsWith("checkpoint " + in_sys.string() + ": ") && Catch::Contains("(errno "));

  // A directory is refused at once (the rename would fail, or replace an empty one).
  const auto folder = dir.path() / "folder";
  std::filesystem::create_directory(folder);
  CHECK_THROWS_WITH(durable_writer(folder, "checkpoint"),
                    Catch::StartsWith("checkpoint " + folder.string() + ": is a directory"));
  std::filesystem::remove(folder);

  // One that appears after the writer was made fails at commit: the error names the target,
  // the temp file goes and the writer is spent.
  const auto occupied = dir.path() / "occupied";
  durable_writer out(occupied, "checkpoint");
  std::filesystem::create_directory(occupied);
  std::filesystem::create_directory(occupied / "inside");  // not empty: rename cannot replace it
  const unsigned char byte = 7;
  out.write(&byte, 1);
  CHECK_THROWS_WITH(out.commit(), Catch::StartsWith("checkpoint " + occupied.string() + ": "));
  CHECK(names_in(dir.path()) == std::vector<std::string>{"occupied"});
  CHECK_THROWS_AS(out.write(&byte, 1), tierflow::error);
  CHECK_THROWS_AS(out.commit(), tierflow::error);
}

TEST_CASE("read_file reads whole files within a limit", "[checkpoint]") {
  auto gen = tierflow::test::rng(305);
  const tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "state.tfck";
  const auto bytes = tierflow::test::random_bytes(100000, gen);
  spit(path, bytes);
  CHECK(tierflow::detail::read_file(path, "checkpoint", bytes.size()) == bytes);
  CHECK(tierflow::detail::read_file(path, "checkpoint", 1u << 30) == bytes);
  spit(path, {});
  CHECK(tierflow::detail::read_file(path, "checkpoint", 0).empty());
}

TEST_CASE("read_file refuses missing, oversized and non-regular files", "[checkpoint]") {
  const tierflow::test::scratch_dir dir;
  const auto read = [](const std::filesystem::path& path, std::uint64_t max_bytes) {
    (void)tierflow::detail::read_file(path, "checkpoint", max_bytes);
  };

  const auto missing = dir.path() / "missing.tfck";
  CHECK_THROWS_AS(read(missing, 1000), tierflow::input_error);
  try {
    read(missing, 1000);
  } catch (const tierflow::input_error& e) {
    CHECK(e.source() == missing.string());
    CHECK(std::string(e.what()) ==
          missing.string() + ": cannot read the checkpoint: No such file or directory");
  }

  const auto big = dir.path() / "big.tfck";
  spit(big, std::vector<unsigned char>(1001, 1));
  CHECK_THROWS_AS(read(big, 1000), tierflow::input_error);
  CHECK_THROWS_WITH(read(big, 1000), Catch::StartsWith(big.string() + ": ") &&
                                         Catch::Contains("too large: 1001 bytes"));
  CHECK_NOTHROW(read(big, 1001));

  CHECK_THROWS_AS(read(dir.path(), 1000), tierflow::input_error);
  CHECK_THROWS_WITH(read(dir.path(), 1000), Catch::Contains("is a directory"));
}
