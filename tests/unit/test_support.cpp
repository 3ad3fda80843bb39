#include "test_support.hpp"

#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "tierflow/log.hpp"

namespace tierflow::test {

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::filesystem::remove(path);  // fixtures are read-only; replace rather than overwrite
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) {
    throw std::runtime_error("cannot write " + path.string());
  }
}

std::vector<std::string> prometheus_format_problems(const std::string& text) {
  static const std::regex help(R"(# HELP (tierflow_[a-zA-Z_:][a-zA-Z0-9_:]*) [^\n]*)");
  static const std::regex type(R"(# TYPE (tierflow_[a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter))");
  static const std::regex sample(
      R"((tierflow_[a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")*\})? ([-+0-9.eE]+|[+-]Inf|NaN))");
  std::vector<std::string> problems;
  std::map<std::string, std::string> types;
  std::istringstream lines(text);
  std::string line;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (line.rfind("# HELP", 0) == 0) {
      if (!std::regex_match(line, m, help)) {
        problems.push_back("bad HELP: " + line);
      }
    } else if (line.rfind("# TYPE", 0) == 0) {
      if (!std::regex_match(line, m, type) || !types.emplace(m[1], m[2]).second ||
          (m[2] == "counter" && !m[1].str().ends_with("_total"))) {
        problems.push_back("bad or repeated TYPE: " + line);
      }
    } else if (!std::regex_match(line, m, sample) || types.count(m[1]) == 0) {
      problems.push_back("bad or untyped sample: " + line);
    }
  }
  return problems;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read " + path.string());
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct captured_log::impl {
  std::mutex mutex;
  std::string lines;
  tierflow::log_level previous_level = tierflow::log_level::warning;
};

captured_log::captured_log() : impl_(new impl) {
  impl_->previous_level = tierflow::get_log_level();
  tierflow::set_log_level(tierflow::log_level::info);
  tierflow::set_log_sink([state = impl_](tierflow::log_level, std::string_view line) {
    const std::lock_guard lock(state->mutex);
    state->lines += std::string(line) + "\n";
  });
}

captured_log::~captured_log() {
  tierflow::set_log_sink({});
  tierflow::set_log_level(impl_->previous_level);
  delete impl_;
}

std::string captured_log::text() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->lines;
}

std::uint64_t mem_total_bytes(int node) {
  std::istringstream in(
      read_file("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string word_node, id, key;
    std::uint64_t kib = 0;
    fields >> word_node >> id >> key >> kib;
    if (key == "MemTotal:") {
      return kib * 1024;
    }
  }
  return 0;
}

scoped_env::scoped_env(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) {
    had_value_ = true;
    old_value_ = old;
  }
  if (value != nullptr) {
    ::setenv(name, value, 1);
  } else {
    ::unsetenv(name);
  }
}

scoped_env::~scoped_env() {
  if (had_value_) {
    ::setenv(name_.c_str(), old_value_.c_str(), 1);
  } else {
    ::unsetenv(name_.c_str());
  }
}

}  // namespace tierflow::test
