#pragma once
// Shared helpers for the unit tests: a seeded random generator (the seed is printed, and can
// be replayed with TIERFLOW_TEST_SEED), fixture paths and scratch copies of fixture trees.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace tierflow::test {

// GCC says which sanitizer a build has with __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang 14
// (the asan preset's compiler) only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define TIERFLOW_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TIERFLOW_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TIERFLOW_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TIERFLOW_TEST_TSAN 1
#endif
#endif

/** Whether this build runs under a sanitizer: memcpy is instrumented (timings are not the
 *  machine's) and mlock is a no-op. Speed checks keep only their lower bounds then. */
#if defined(TIERFLOW_TEST_ASAN) || defined(TIERFLOW_TEST_TSAN)
inline constexpr bool under_sanitizer = true;
#else
inline constexpr bool under_sanitizer = false;
#endif

/** The run's random seed: TIERFLOW_TEST_SEED when set, else fresh; printed once. */
inline std::uint64_t seed() {
  static const std::uint64_t value = [] {
    std::uint64_t s = 0;
    if (const char* text = std::getenv("TIERFLOW_TEST_SEED"); text != nullptr && *text) {
      s = std::strtoull(text, nullptr, 10);
    } else {
      s = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    std::cout << "tierflow tests: random seed " << s << " (replay with TIERFLOW_TEST_SEED=" << s
              << ")\n";
    return s;
  }();
  return value;
}

/** A generator seeded from seed() and @p stream, so each test draws its own sequence. */
inline std::mt19937_64 rng(std::uint64_t stream) {
  return std::mt19937_64(seed() ^ (stream * 0x9e3779b97f4a7c15ULL));
}

/** @p n random bytes, none of them zero. */
inline std::vector<unsigned char> random_bytes(std::size_t n, std::mt19937_64& gen) {
  std::vector<unsigned char> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const auto word = gen() | 0x0101010101010101ULL;  // no zero byte
    std::memcpy(&v[i], &word, 8);
  }
  for (; i < n; ++i) {
    v[i] = static_cast<unsigned char>(gen() | 1);
  }
  return v;
}

/** tests/data, as configured by CMake. */
inline std::filesystem::path data_dir() {
  return TIERFLOW_TEST_DATA_DIR;
}

/** A fake sysfs tree under tests/data/sysfs. */
inline std::filesystem::path sysfs_fixture(const std::string& name) {
  return data_dir() / "sysfs" / name;
}

/** An hwloc XML fixture under tests/data/hwloc. */
inline std::filesystem::path hwloc_fixture(const std::string& name) {
  return data_dir() / "hwloc" / name;
}

/** A fresh scratch directory, removed when the object goes. */
class scratch_dir {
 public:
  scratch_dir() {
    auto gen = rng(reinterpret_cast<std::uintptr_t>(this));
    path_ = std::filesystem::temp_directory_path() / ("tierflow-test-" + std::to_string(gen()));
    std::filesystem::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/** A writable copy of a fixture tree (symbolic links kept as links). */
class fixture_copy {
 public:
  explicit fixture_copy(const std::string& name) {
    std::filesystem::copy(
        sysfs_fixture(name), dir_.path(),
        std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
  }
  [[nodiscard]] const std::filesystem::path& root() const { return dir_.path(); }
  /** Path of @p relative (e.g. "sys/devices/system/node/online") inside the copy. */
  [[nodiscard]] std::filesystem::path at(const std::string& relative) const {
    return dir_.path() / relative;
  }

 private:
  scratch_dir dir_;
};

/** Writes @p text to @p path, replacing it. */
void write_file(const std::filesystem::path& path, const std::string& text);

/** MemTotal of NUMA node @p node in bytes, read from sysfs now (0 if absent): an oracle that
 *  does not go through tierflow's own reader. */
std::uint64_t mem_total_bytes(int node);

/** Lines of @p text that break the Prometheus text format (0.0.4) as tierflow writes it:
 *  `# HELP` / `# TYPE` lines, samples of `tierflow_` names with escaped labels, each family
 *  typed before its samples and typed once, counters ending in `_total`. Empty: it parses. */
std::vector<std::string> prometheus_format_problems(const std::string& text);

/** Reads a whole file. */
std::string read_file(const std::filesystem::path& path);

/** Collects tierflow's log lines while it lives (and keeps them off stderr). */
class captured_log {
 public:
  captured_log();
  captured_log(const captured_log&) = delete;
  captured_log& operator=(const captured_log&) = delete;
  ~captured_log();
  /** Every line so far, joined by newlines. */
  [[nodiscard]] std::string text() const;

 private:
  struct impl;
  impl* impl_;
};

/** Sets an environment variable for the lifetime of the object, then restores it. */
class scoped_env {
 public:
  scoped_env(const char* name, const char* value);
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env();

 private:
  std::string name_;
  bool had_value_ = false;
  std::string old_value_;
};

}  // namespace tierflow::test
