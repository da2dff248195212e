// Fills the process's descriptor table for the object's lifetime, as a
// neighbour flooding the metrics port does: every open, socket or opendir
// then fails with EMFILE. The soft RLIMIT_NOFILE is lowered to at most 1024
// first so that filling is quick; both are undone by the destructor.
// Not under a sanitizer (test/support/sanitized.h): its runtime needs descriptors.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <vector>

namespace efa::testing {

class DescriptorTableFull {
 public:
  DescriptorTableFull() {
    if (::getrlimit(RLIMIT_NOFILE, &saved_) != 0) throw std::runtime_error("getrlimit failed");
    rlimit low = saved_;
    low.rlim_cur = std::min<rlim_t>(saved_.rlim_cur, 1024);
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) throw std::runtime_error("setrlimit failed");
    Refill();
  }
  // Takes the descriptors other threads closed since (a test process has
  // gRPC threads of its own).
  void Refill() {
    for (int fd; (fd = ::dup(STDERR_FILENO)) >= 0;) filler_.push_back(fd);
    if (errno != EMFILE) throw std::runtime_error("dup failed otherwise than with EMFILE");
  }
  ~DescriptorTableFull() { Release(); }
  DescriptorTableFull(const DescriptorTableFull&) = delete;
  DescriptorTableFull& operator=(const DescriptorTableFull&) = delete;

  // Gives the descriptors back now.
  void Release() {
    for (int fd : filler_) ::close(fd);
    filler_.clear();
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }

 private:
  rlimit saved_{};
  std::vector<int> filler_;
};

}  // namespace efa::testing
