#pragma once
/** @file
 * @brief The tierflow exception hierarchy and the argument-checking macro.
 *
 * Every public call reports failure by throwing one of these types; none of them is thrown
 * from a destructor. The C ABI (a later layer) turns them into error codes.
 */

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace tierflow {

/** @brief Base of every exception tierflow throws (except out-of-memory types). */
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/**
 * @brief Bad input from outside the program: a file, a sysfs entry, an environment variable,
 * a command-line value or a configuration key.
 *
 * `what()` is one line: `SOURCE: PROBLEM: 'OFFENDING TEXT'` (the quote part is left out when
 * there is no offending text, e.g. for a missing file).
 */
class input_error : public error {
 public:
  /**
   * @param source where the input came from: a path, `FILE:LINE`, or `env NAME`
   * @param problem what is wrong with it, in a few words
   * @param offending_text the text that was rejected (may be empty)
   */
  input_error(std::string source, std::string problem, std::string offending_text = {});

  /** @brief Where the bad input came from. */
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /** @brief What is wrong with it. */
  [[nodiscard]] const std::string& problem() const noexcept { return problem_; }
  /** @brief The rejected text, possibly shortened for display; may be empty. */
  [[nodiscard]] const std::string& offending_text() const noexcept { return offending_text_; }

 private:
  std::string source_;
  std::string problem_;
  std::string offending_text_;
};

/**
 * @brief The machine, not the caller, refused: a full disk, a read-only file system, a folder
 * without write permission, the locked-memory limit, a thread that could not be created, a
 * failed mmap or mbind. Retrying later, or fixing the machine, may help; changing the call
 * will not.
 *
 * `what()` is one line, `CONTEXT: STRERROR (errno N)`, where CONTEXT names the resource, e.g.
 * `checkpoint /x/y.tfck: write failed: No space left on device (errno 28)`.
 */
class environment_error : public error {
 public:
  /**
   * @param context what failed, naming the resource (when it does not, the resource is put in
   *        front of it)
   * @param resource the path, or the resource (`thread`, `mlock`, a tier) that failed
   * @param error_code the errno value the system gave (0: none; then no STRERROR part)
   */
  environment_error(const std::string& context, std::string resource, int error_code);

  /** @brief The path or resource that failed. */
  [[nodiscard]] const std::string& resource() const noexcept { return resource_; }
  /** @brief The errno value (0 when the system gave none). */
  [[nodiscard]] int error_code() const noexcept { return error_code_; }

 private:
  std::string resource_;
  int error_code_ = 0;
};

/**
 * @brief A call on an object that is in use by another thread's call (e.g. two threads
 * stepping one offload_adam), refused before it changed anything.
 *
 * `what()` names the refused call and, when known, the call in progress.
 */
class busy_error : public error {
 public:
  /**
   * @param call the refused call, e.g. `offload_adam::step`
   * @param running the call in progress on the object (may be empty: unknown)
   */
  busy_error(std::string call, const std::string& running);

  /** @brief The refused call. */
  [[nodiscard]] const std::string& call() const noexcept { return call_; }

 private:
  std::string call_;
};

/**
 * @brief A tier (or every tier a placement tried) has no room for an allocation.
 *
 * Carries what was asked for and what each tier had free when it was refused. `what()` is one
 * line, e.g. `optimizer_state: 8.0 GiB asked; free: cxl0 1.0 GiB, dram0 512 MiB`.
 */
class out_of_capacity : public std::bad_alloc {
 public:
  /** @brief A tier and its free bytes at the time of the refusal. */
  struct tier_free {
    std::string tier;
    std::uint64_t free_bytes = 0;
  };

  /**
   * @param context what was being allocated: a tier or resource name, or a data class
   * @param requested_bytes bytes asked for
   * @param free the tiers that were tried, in order, with their free bytes
   */
  out_of_capacity(std::string context, std::uint64_t requested_bytes, std::vector<tier_free> free);

  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  /** @brief What was being allocated (tier, resource or data class). */
  [[nodiscard]] const std::string& context() const noexcept { return context_; }
  /** @brief Bytes asked for. */
  [[nodiscard]] std::uint64_t requested_bytes() const noexcept { return requested_bytes_; }
  /** @brief Tiers tried, in order, with their free bytes. */
  [[nodiscard]] const std::vector<tier_free>& tiers() const noexcept { return tiers_; }

 private:
  std::string context_;
  std::uint64_t requested_bytes_ = 0;
  std::vector<tier_free> tiers_;
  std::string message_;
};

/** @brief Formats a byte count for messages: `512 B`, `64.0 KiB`, `1.5 GiB`. */
[[nodiscard]] std::string format_byte_count(std::uint64_t bytes);

namespace detail {
/** @brief Throws tierflow::error for a failed TIERFLOW_EXPECTS (kept out of line). */
[[noreturn]] void throw_expects_failure(const char* condition, const std::string& message,
                                        const char* file, int line);
}  // namespace detail

}  // namespace tierflow

/**
 * @brief Checks a precondition of a public call; throws tierflow::error naming the condition,
 * the message and file:line when it does not hold.
 */
#define TIERFLOW_EXPECTS(condition, message)                                                \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      ::tierflow::detail::throw_expects_failure(#condition, (message), __FILE__, __LINE__); \
    }                                                                                       \
  } while (false)
