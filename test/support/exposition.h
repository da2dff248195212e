// A Prometheus text exposition read back by an independent parser: the
// Python prometheus_client's (test/support/exposition_summary.py).
#pragma once

#include <stdio.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "test/support/build_paths.h"
#include "test/support/temp_dir.h"

namespace efa::testing {

struct ExpositionSummary {
  int exit_status = -1;  // 0: the parser read it all
  std::string text;      // the script's output
};

// Families, types, HELP texts and series of `exposition` (values: every
// sample with its value), as exposition_summary.py prints them.
inline ExpositionSummary SummarizeExposition(const std::string& exposition, bool values = false) {
  TempDir dir;
  const auto file = dir.path() / "metrics.txt";
  std::ofstream(file) << exposition;
  const std::string command = std::string("/usr/bin/python3 ") + kExpositionSummary +
                              (values ? " --values " : " ") + file.string();
  ExpositionSummary out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.text.append(buf, n);
  out.exit_status = ::pclose(pipe);
  return out;
}

// Samples of a text exposition keyed by the series exactly as written
// (`name{label="value"}`); comments are skipped.
inline std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.rfind(' ');
    if (line.empty() || line[0] == '#' || space == std::string::npos) continue;
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

}  // namespace efa::testing
