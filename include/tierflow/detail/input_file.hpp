#pragma once
/** @file
 * @brief The one way tierflow opens a file it reads: non-blocking, regular files only, with a
 * size bound. Every reader (configuration, plans, reports, checkpoints, the measured cache)
 * goes through it, so a FIFO, a device node or a folder is one clear input_error, never a hang.
 */

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tierflow::detail {

/**
 * @brief A file opened for reading that is known to be a regular file of at most a given size.
 *
 * The open is `O_NONBLOCK` (a FIFO does not hang the open) and `fstat` of the descriptor then
 * refuses anything but a regular file (no race between the check and the read).
 */
class input_file {
 public:
  /**
   * @param path the file
   * @param what what the file is, e.g. "checkpoint": part of every message
   * @param max_bytes the largest size accepted
   * @throws tierflow::input_error naming the path when it is missing or unreadable, a folder, a
   * FIFO, a device or other non-regular file, or larger than @p max_bytes
   */
  input_file(const std::filesystem::path& path, std::string what, std::uint64_t max_bytes);
  /** @brief Closes the file. Never throws. */
  ~input_file();
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;

  /** @brief The open descriptor (owned by this object). */
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /** @brief The size fstat reported at open. */
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  /** @brief The path, as messages name it. */
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /** @brief What the file is, as messages name it. */
  [[nodiscard]] const std::string& what() const noexcept { return what_; }

 private:
  std::string source_;
  std::string what_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/**
 * @brief Reads all of @p path through input_file, refusing files of more than @p max_bytes.
 * @param what what the file is, e.g. "checkpoint", for messages
 * @throws tierflow::input_error naming the path (see input_file), or when the file grows past
 * @p max_bytes while it is read
 */
[[nodiscard]] std::vector<unsigned char> read_file(const std::filesystem::path& path,
                                                   const std::string& what,
                                                   std::uint64_t max_bytes);

/** @brief read_file() as text. */
[[nodiscard]] std::string read_text_file(const std::filesystem::path& path, const std::string& what,
                                         std::uint64_t max_bytes);

}  // namespace tierflow::detail
