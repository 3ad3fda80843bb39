#pragma once
// Files that are either wholly written or not there at all, and whole-file reads with a size
// limit: for checkpoints and other state that must survive a crash mid-write.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tierflow/detail/input_file.hpp"

namespace tierflow::detail {

/**
 * @brief Removes `NAME.tmp.PID.SUFFIX` files beside @p path (NAME: its file name, cut as
 * durable_writer cuts it), left by a durable_writer killed mid-write, whose writer process no
 * longer exists. Files of live processes, of this process, and names of any
 * other shape are left alone. Never throws; a file that cannot be removed stays.
 */
void remove_stale_temps(const std::filesystem::path& path) noexcept;

/**
 * @brief Writes a file that replaces @p path all at once, or not at all.
 *
 * The bytes go to `NAME.tmp.<pid>.<random>` in the same directory (so the rename cannot cross
 * filesystems; NAME is the file name cut to its first 223 bytes, so that the temp name stays
 * within the 255 bytes a name may have); commit() fsyncs it, renames it over PATH and fsyncs the
 * directory. A crash or an exception before the rename leaves PATH as it was. What the system
 * refuses (no room, no permission, a read-only file system: any errno) is environment_error, with
 * one line, `WHAT PATH: PROBLEM: STRERROR (errno N)`, e.g. `checkpoint /x/y.tfck: write failed: No
 * space left on device (errno 28)`; a path that is not a regular file is tierflow::error.
 *
 * After any failure the temp file is already gone and the writer refuses further use.
 *
 * The constructor refuses a @p path that exists and is not a regular file (a folder, a FIFO,
 * /dev/null: the rename would replace the node), and removes the temp files of earlier writers
 * of the same path that died mid-write (remove_stale_temps()).
 */
class durable_writer {
 public:
  /**
   * @brief Creates the temp file beside @p path (mode 0644 before the umask).
   * @param path the file to replace (or create); its directory must exist
   * @param what what is being written, e.g. "checkpoint": the start of every error message
   * @throws input_error naming the path for an empty path, a file name over 255 bytes, or a
   *         folder that does not exist (or is a file); environment_error naming the path when
   *         the temp file cannot be created; tierflow::error when the path exists and is not a
   *         regular file
   */
  durable_writer(std::filesystem::path path, std::string what);

  /** @brief Removes the temp file unless commit() succeeded. Never throws. */
  ~durable_writer();

  durable_writer(const durable_writer&) = delete;
  durable_writer& operator=(const durable_writer&) = delete;

  /**
   * @brief Appends @p bytes bytes from @p data (partial writes and EINTR are retried).
   * @throws environment_error naming the path, e.g. when the disk is full
   */
  void write(const void* data, std::size_t bytes);

  /**
   * @brief Makes the file durable and puts it in place: fsync, rename over the path, fsync of
   * the directory. Call once; the writer is spent afterwards.
   * @throws environment_error naming the path. If only the directory fsync failed, the new file
   * is already in place, but its name may not survive a crash.
   */
  void commit();

  /** @brief The file being replaced. */
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  /** @brief Closes and removes the temp file, then throws environment_error for @p problem
   * when @p code (an errno) is not 0 or @p environment is set, else tierflow::error. */
  [[noreturn]] void fail(const std::string& problem, int code, bool environment = false);
  /** @brief Throws input_error for a path no file can have: empty, a name too long, in a
   * folder that is not there. */
  void check_target() const;
  /** @brief Closes and removes the temp file if still there; never throws. */
  void discard() noexcept;

  std::filesystem::path path_;
  std::filesystem::path temp_;
  std::string what_;
  int fd_ = -1;                // the open temp file, or -1 once closed
  bool temp_present_ = false;  // the temp file exists under temp_ (not yet renamed)
};

}  // namespace tierflow::detail
