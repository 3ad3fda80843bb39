// Issue 22, class 2: files that are not regular files (docs/bad-input.md). Every reader goes
// through detail::input_file (non-blocking open, fstat, a size bound) and every durable write
// refuses to replace anything but a regular file; a later save removes the temps of dead
// writers. Section 3's creation-time checks of the C ABI are here too (destroy order, overlap).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "adam_harness.hpp"
#include "core/durable_file.hpp"
#include "test_support.hpp"
#include "tierflow/detail/input_file.hpp"
#include "tierflow/error.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/tierflow.h"
#include "tierflow/topology.hpp"
#include "topology/measured_cache.hpp"

using namespace tierflow;
namespace fs = std::filesystem;

namespace {

// A FIFO with no writer: a blocking open of it never returns.
fs::path make_fifo(const fs::path& path) {
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  return path;
}

// The pid of a process that has exited and been reaped (so no process has it, for now).
pid_t dead_pid() {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

bool is_a_fifo(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

}  // namespace

TEST_CASE("bad input: every reader refuses a FIFO, a device, a folder and a huge file",
          "[bad_input][files]") {
  test::scratch_dir dir;
  const auto fifo = make_fifo(dir.path() / "fifo");
  const auto big = dir.path() / "big";
  test::write_file(big, std::string((1 << 20) + 1, '#'));  // past the configuration bound
  struct reader {
    const char* name;
    std::function<void(const fs::path&)> read;
    bool bound_1mib = true;  // refuses files over 1 MiB (hwloc XML: 64 MiB)
  };
  const std::vector<reader> readers = {
      {"detail::read_file", [](const fs::path& p) { (void)detail::read_file(p, "file", 1 << 20); }},
      {"settings::from_file (TIERFLOW_CONFIG, --config)",
       [](const fs::path& p) { (void)settings::from_file(p); }},
      {"topology::discover (--hwloc-xml)",
       [](const fs::path& p) {
         discovery_options o;
         o.sysfs_root = test::sysfs_fixture("two_socket_cxl");
         o.hwloc_xml = p;
         (void)topology::discover(o);
       },
       false},
      {"the measured-attribute cache",
       [](const fs::path& p) {
         std::string key;
         (void)detail::load_measured_cache(p, key);
       }},
  };
  struct target {
    const char* what;
    fs::path path;
    const char* problem;
  };
  const std::vector<target> targets = {
      {"a FIFO", fifo, "not a regular file"},
      {"/dev/zero", "/dev/zero", "not a regular file"},
      {"a folder", dir.path(), "is a directory"},
      {"a file over the bound", big, "too large"},
  };
  for (const auto& r : readers) {
    for (const auto& t : targets) {
      if (t.path == big && !r.bound_1mib) {
        continue;
      }
      INFO(r.name << " of " << t.what);
      const auto start = std::chrono::steady_clock::now();
      try {
        r.read(t.path);
        FAIL("accepted");
      } catch (const input_error& e) {
        CHECK(e.source() == t.path.string());
        CHECK_THAT(e.what(), Catch::Contains(t.problem));
      }
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));  // no hang
    }
  }
}

TEST_CASE(
    "bad input: tf_adam_load of a FIFO or a folder is TF_ERR_INPUT naming the path, and "
    "tf_adam_save refuses to replace a device node, a FIFO or a folder",
    "[bad_input][files][capi]") {
  auto gen = test::rng(0x22f1);
  test::scratch_dir dir;
  const std::size_t n = test::uniform(gen, 16, 300);
  const auto values = test::nonzero_normals(n, 1.0f, gen);
  const test::c_adam_one_param one(values, values);
  tf_adam* adam = one.adam();

  const auto fifo = make_fifo(dir.path() / "ckpt.fifo");
  for (const fs::path& path : {fifo, dir.path(), fs::path("/dev/zero")}) {
    INFO(path);
    CHECK(tf_adam_load(adam, path.c_str()) == TF_ERR_INPUT);
    CHECK_THAT(tf_last_error(), Catch::StartsWith("tf_adam_load: " + path.string() + ": "));
  }
  for (const fs::path& path : {fifo, dir.path(), fs::path("/dev/null")}) {
    INFO(path);
    CHECK(tf_adam_save(adam, path.c_str()) != TF_OK);
    CHECK_THAT(tf_last_error(),
               Catch::Contains(path.string()) && Catch::Contains("refusing to replace it"));
  }
  CHECK(is_a_fifo(fifo));  // still the FIFO, not a checkpoint renamed over it
  struct stat null_st {};
  REQUIRE(::stat("/dev/null", &null_st) == 0);
  CHECK(S_ISCHR(null_st.st_mode));
  // No temp file is left beside the refused targets.
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
  }
  // And a regular file still works.
  const auto good = dir.path() / "ckpt.tfck";
  CHECK(tf_adam_save(adam, good.c_str()) == TF_OK);
  CHECK(tf_adam_load(adam, good.c_str()) == TF_OK);
}

TEST_CASE("bad input: a later save removes the temp files of writers that are gone",
          "[bad_input][files]") {
  auto gen = test::rng(0x22f2);
  test::scratch_dir dir;
  const auto target = dir.path() / "state.tfck";
  const auto suffix = [&] {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(gen()));
    return std::string(text);
  };
  const std::string base = target.string() + ".tmp.";
  const fs::path dead = base + std::to_string(dead_pid()) + "." + suffix();
  const fs::path live = base + std::to_string(::getppid()) + "." + suffix();  // a live process
  const fs::path mine = base + std::to_string(::getpid()) + "." + suffix();   // this process
  const fs::path odd = base + "12x." + suffix();                              // not a pid
  const fs::path other = dir.path() / ("other.tfck.tmp." + std::to_string(dead_pid()) + "." +
                                       suffix());  // another target's
  for (const auto& p : {dead, live, mine, odd, other}) {
    test::write_file(p, "partial");
  }
  {
    detail::durable_writer out(target, "checkpoint");
    const std::string text = "whole";
    out.write(text.data(), text.size());
    out.commit();
  }
  CHECK(test::read_file(target) == "whole");
  CHECK_FALSE(fs::exists(dead));
  for (const auto& kept : {live, mine, odd, other}) {
    INFO(kept);
    CHECK(fs::exists(kept));
  }
}

TEST_CASE(
    "bad input: a save into a missing folder, to an empty path or to a name over 255 bytes is "
    "TF_ERR_INPUT naming it, and names of 230 to 255 bytes save",
    "[bad_input][files][capi]") {
  auto gen = test::rng(0x34c9);
  test::scratch_dir dir;
  const std::size_t n = test::uniform(gen, 16, 300);
  const auto values = test::nonzero_normals(n, 1.0f, gen);
  const test::c_adam_one_param one(values, values);
  tf_adam* adam = one.adam();
  const auto refused = [&](const std::string& path, const std::string& problem,
                           const std::string& named) {
    INFO("path '" << path << "'");
    CHECK(tf_adam_save(adam, path.c_str()) == TF_ERR_INPUT);
    CHECK_THAT(tf_last_error(), Catch::StartsWith("tf_adam_save: ") && Catch::Contains(problem) &&
                                    Catch::Contains(named));
  };

  // A folder that is not there, or a file where the folder should be: the caller's mistake.
  const fs::path missing = dir.path() / "no" / "such";
  refused((missing / "x.tfck").string(), "does not exist", "'" + missing.string() + "'");
  test::write_file(dir.path() / "plain", "a file");
  refused((dir.path() / "plain" / "x.tfck").string(), "is not a folder",
          (dir.path() / "plain").string());
  // An empty path (it was a rename failure).
  refused("", "empty path", "checkpoint");

  // Names of 230 to 255 bytes save and load (their temp name exceeded NAME_MAX); a dead
  // writer's temp file of such a name is found and removed by the next save.
  for (int round = 0; round < 4; ++round) {
    const std::size_t length = round == 0 ? 255 : test::uniform(gen, 230, 255);
    const std::string name(length, static_cast<char>('a' + round));
    const fs::path target = dir.path() / name;
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(gen()));
    const fs::path stale =
        dir.path() / (name.substr(0, 223) + ".tmp." + std::to_string(dead_pid()) + "." + suffix);
    test::write_file(stale, "partial");
    INFO(length << " bytes");
    CHECK(tf_adam_save(adam, target.c_str()) == TF_OK);
    CHECK(tf_adam_load(adam, target.c_str()) == TF_OK);
    CHECK_FALSE(fs::exists(stale));
  }
  // 256 bytes and more: refused at once, naming the length.
  for (const std::size_t length : {std::size_t{256}, test::uniform(gen, 257, 4000)}) {
    const fs::path target = dir.path() / std::string(length, 'z');
    refused(target.string(), "file name is " + std::to_string(length) + " bytes long", "255");
  }
  // Nothing but the saved checkpoints (4 names) and the plain file is left: no temp file.
  std::size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
    ++entries;
  }
  CHECK(entries <= 5);
  CHECK_FALSE(fs::exists(dir.path() / "no"));
}

TEST_CASE(
    "bad input: tf_adam_destroy after tf_device_destroy is safe, and overlapping params "
    "and a grad equal to its param are refused at creation",
    "[bad_input][capi][lifetime]") {
  auto gen = test::rng(0x22f3);
  tf_device* dev = nullptr;
  REQUIRE(tf_device_open("emulated", &dev) == TF_OK);
  const std::size_t n = test::uniform(gen, 64, 400);
  void* block = nullptr;
  REQUIRE(tf_device_alloc(dev, 4 * n * 4, &block) == TF_OK);
  auto* f = static_cast<float*>(block);
  const auto values = test::nonzero_normals(4 * n, 0.5f, gen);
  REQUIRE(tf_device_copy(dev, block, values.data(), 4 * n * 4, TF_COPY_H2D) == TF_OK);
  tf_adam_hyper hyper;
  tf_adam_hyper_default(&hyper);
  const tf_adam_options o = test::c_cpu_options();
  struct row {
    const char* what;
    std::vector<tf_adam_param> params;
  };
  const std::size_t half = n / 2;
  const std::vector<row> refused = {
      {"grad == param", {{"a", f, f, TF_DTYPE_F32, n, 0, 0}}},
      {"grad overlaps its param", {{"a", f, f + half, TF_DTYPE_F32, n, 0, 0}}},
      {"two params overlap",
       {{"a", f, f + 2 * n, TF_DTYPE_F32, n, 0, 0},
        {"b", f + half, f + 3 * n, TF_DTYPE_F32, n, 0, 0}}},
      {"a param overlaps another's grad",
       {{"a", f, f + 2 * n, TF_DTYPE_F32, n, 0, 0},
        {"b", f + 2 * n + half, f + n, TF_DTYPE_F32, n, 0, 0}}},
      {"a bf16 param's last byte overlaps another param",
       {{"a", f, f + 2 * n, TF_DTYPE_BF16, n + 1, 0, 0},
        {"b", reinterpret_cast<char*>(f) + 2 * n, f + 3 * n, TF_DTYPE_BF16, n / 2, 0, 0}}},
  };
  for (const auto& r : refused) {
    INFO(r.what);
    tf_adam* adam = nullptr;
    CHECK(tf_adam_create(dev, r.params.data(), r.params.size(), &hyper, 1, &o, &adam) ==
          TF_ERR_INVALID_ARGUMENT);
    CHECK(adam == nullptr);
    CHECK_THAT(tf_last_error(), Catch::Contains("overlaps"));
  }
  // Adjacent params, and two params sharing one grad (read only), are fine.
  const std::vector<tf_adam_param> fine = {{"a", f, f + 2 * n, TF_DTYPE_F32, n, 0, 0},
                                           {"b", f + n, f + 2 * n, TF_DTYPE_F32, n, 0, 0}};
  tf_adam* adam = nullptr;
  REQUIRE(tf_adam_create(dev, fine.data(), fine.size(), &hyper, 1, &o, &adam) == TF_OK);
  int applied = 0;
  double norm = 0;
  REQUIRE(tf_adam_step(adam, &applied, &norm) == TF_OK);
  CHECK(applied == 1);

  // The ordinary wrong cleanup order: the device handle first. The optimizer keeps the device
  // alive: it still steps, and its destroy frees everything (ASan would see a leak or a
  // use after free).
  tf_device_destroy(dev);
  REQUIRE(tf_adam_step(adam, &applied, &norm) == TF_OK);
  CHECK(applied == 1);
  std::vector<float> master(n);
  REQUIRE(tf_adam_master_weights(adam, 1, master.data(), n) == TF_OK);
  CHECK(master[0] != values[n]);  // two steps moved it
  tf_adam_destroy(adam);
}
