// Captures what spdlog's default logger writes, for tests that check a
// message (the whole line, "[level] text").
#pragma once

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace efa::testing {

// Captures what the default logger writes while it lives. Not for tests
// that run daemons on other threads (it replaces the logger process-wide).
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("[%l] %v");
    auto logger = std::make_shared<spdlog::logger>("capture", sink);
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // The lines logged since the last call.
  std::vector<std::string> Take() {
    std::vector<std::string> lines;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    out_.str("");
    return lines;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace efa::testing
