// Issue 22, class 4: what the machine refuses (a read-only or permission-denied folder, a file
// size limit, a full disk) is environment_error / TF_ERR_ENVIRONMENT naming the path and the
// errno, never an invalid argument; and the checkpoint that was there is intact
// (docs/errors.md).

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adam_harness.hpp"
#include "core/durable_file.hpp"
#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/tierflow.h"

using namespace tierflow;
namespace fs = std::filesystem;

namespace {

std::vector<char> bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool has_temp_files(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) {
      return true;
    }
  }
  return false;
}

// While alive, files of this process may grow to @p bytes at most: a write past it fails with
// EFBIG (SIGXFSZ ignored), as a full disk fails with ENOSPC, even for root.
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_) == 0);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lowered) == 0);
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
};

}  // namespace

TEST_CASE("environment_error says the resource and the errno, busy_error both calls",
          "[environment][busy]") {
  const environment_error full("checkpoint /x/y.tfck: write failed", "/x/y.tfck", ENOSPC);
  CHECK(std::string(full.what()) ==
        "checkpoint /x/y.tfck: write failed: " + std::string(std::strerror(ENOSPC)) + " (errno " +
            std::to_string(ENOSPC) + ")");
  CHECK(full.resource() == "/x/y.tfck");
  CHECK(full.error_code() == ENOSPC);
  // A context that does not name the resource gets it in front; no errno, no errno part.
  const environment_error stalled("write made no progress", "/x/z", 0);
  CHECK(std::string(stalled.what()) == "/x/z: write made no progress");
  const error& as_base = full;  // a tierflow::error, so older catch sites still see it
  CHECK_THAT(as_base.what(), Catch::Contains("No space left"));

  const busy_error busy("offload_adam::save", "offload_adam::step");
  CHECK_THAT(busy.what(), Catch::StartsWith("offload_adam::save: refused: offload_adam::step is "
                                            "in progress"));
  CHECK(busy.call() == "offload_adam::save");
}

TEST_CASE(
    "environment: a save the system refuses is TF_ERR_ENVIRONMENT naming the path and the "
    "errno, and the checkpoint that was there is intact",
    "[environment][files][capi]") {
  auto gen = test::rng(0x22e4);
  test::scratch_dir dir;
  // 12 bytes of state per element: the checkpoint is well over the 16 KiB limit below.
  const std::size_t n = test::uniform(gen, 3000, 6000);
  const auto values = test::nonzero_normals(n, 1.0f, gen);
  const auto grads = test::nonzero_normals(n, 0.3f, gen);
  const test::c_adam_one_param one(values, grads);
  tf_adam* adam = one.adam();
  REQUIRE(tf_adam_step(adam, nullptr, nullptr) == TF_OK);
  const auto good = dir.path() / "ckpt.tfck";
  REQUIRE(tf_adam_save(adam, good.c_str()) == TF_OK);
  const auto saved = bytes_of(good);
  std::vector<float> saved_master(n);
  REQUIRE(tf_adam_master_weights(adam, 0, saved_master.data(), n) == TF_OK);
  REQUIRE(tf_adam_step(adam, nullptr, nullptr) == TF_OK);  // the live state moves on

  // /sys takes no new files, even from root (EACCES; EROFS where it is mounted read-only).
  const fs::path in_sys = "/sys/tierflow-test-ckpt.tfck";
  CHECK(tf_adam_save(adam, in_sys.c_str()) == TF_ERR_ENVIRONMENT);
  CHECK_THAT(tf_last_error(), Catch::StartsWith("tf_adam_save: checkpoint " + in_sys.string()) &&
                                  Catch::Contains("(errno "));
  CHECK_FALSE(fs::exists(in_sys));

  // A folder without write permission (root ignores it: then this part has nothing to show).
  const auto locked = dir.path() / "locked";
  fs::create_directory(locked);
  const auto locked_ckpt = locked / "ckpt.tfck";
  fs::copy_file(good, locked_ckpt);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  if (::geteuid() != 0) {
    CHECK(tf_adam_save(adam, locked_ckpt.c_str()) == TF_ERR_ENVIRONMENT);
    CHECK_THAT(tf_last_error(),
               Catch::Contains(locked_ckpt.string()) && Catch::Contains(std::strerror(EACCES)));
    CHECK(bytes_of(locked_ckpt) == saved);
  } else {
    WARN("running as root: folder permissions are not enforced; /sys and the size limit stand in");
  }
  fs::permissions(locked, fs::perms::owner_all);

  // A write that runs out of room midway (the size limit stands in for a full disk).
  {
    const file_size_limit limit(16 * 1024);
    CHECK(tf_adam_save(adam, good.c_str()) == TF_ERR_ENVIRONMENT);
    const std::string message = tf_last_error();
    CHECK_THAT(message, Catch::Contains("checkpoint " + good.string() + ": write failed: ") &&
                            Catch::Contains(std::strerror(EFBIG)) &&
                            Catch::EndsWith("(errno " + std::to_string(EFBIG) + ")"));
    // The C++ type under it carries the path and the errno.
    try {
      detail::durable_writer out(dir.path() / "other.bin", "test file");
      const std::vector<char> big(64 * 1024, 'x');
      out.write(big.data(), big.size());
      FAIL("a write past the file size limit succeeded");
    } catch (const environment_error& e) {
      CHECK(e.resource() == (dir.path() / "other.bin").string());
      CHECK(e.error_code() == EFBIG);
    }
  }
  // Nothing lost: the file is the earlier checkpoint, whole, and no temp file is left.
  CHECK(bytes_of(good) == saved);
  CHECK_FALSE(has_temp_files(dir.path()));
  CHECK_FALSE(fs::exists(dir.path() / "other.bin"));
  REQUIRE(tf_adam_load(adam, good.c_str()) == TF_OK);
  std::vector<float> master(n);
  REQUIRE(tf_adam_master_weights(adam, 0, master.data(), n) == TF_OK);
  CHECK(master == saved_master);
  // And with room again the save works.
  CHECK(tf_adam_save(adam, good.c_str()) == TF_OK);
}
