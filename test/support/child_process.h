// A program run as a child process (the daemon's binary, a helper) for the
// tests and the benchmarks, its output in a log file; killed when the object
// goes away or the test process dies.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace efa::testing {

class ChildProcess {
 public:
  // Starts argv[0] with `argv`, stdout and stderr appended to `log`; with
  // `max_files` > 0 its RLIMIT_NOFILE (soft and hard) is that, as in a
  // container that allows so many descriptors. With `own_group` it leads a
  // process group of its own, which KillGroup ends. Throws
  // std::runtime_error (naming the program) when it cannot start.
  ChildProcess(std::vector<std::string> argv, const std::filesystem::path& log,
               rlim_t max_files = 0, bool own_group = false) {
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error(log.string() + ": " + std::strerror(errno));
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (own_group) ::setpgid(0, 0);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      const rlimit files{max_files, max_files};
      if (max_files > 0 && ::setrlimit(RLIMIT_NOFILE, &files) != 0) ::_exit(126);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(log_fd);
    if (pid_ < 0) throw std::runtime_error(argv[0] + ": fork: " + std::strerror(errno));
    // Both sides, so that the group is there whichever runs first.
    if (own_group) ::setpgid(pid_, pid_);
    group_ = own_group ? pid_ : -1;
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Waits for the process to end (through its pidfd); returns its exit
  // status (128 + N when killed by signal N), or -1 when `timeout` passed.
  int Wait(std::chrono::milliseconds timeout) {
    pollfd p{pidfd_, POLLIN, 0};
    if (pid_ <= 0 || ::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // With own_group: SIGKILLs every process left in its group (what it
  // started: a helper between fork and exec still holds a copy of its
  // descriptors, its listening sockets too) and reaps each, the process
  // itself too when it has not ended, as the kernel does to a container's
  // processes when its PID 1 ends. The processes it left behind are this
  // process's children only when this process is a child subreaper
  // (PR_SET_CHILD_SUBREAPER): else they are not waited for.
  void KillGroup() {
    if (group_ <= 0) return;
    ::kill(-group_, SIGKILL);
    // Ends with ECHILD: no child of this process is left in the group.
    while (::waitpid(-group_, nullptr, 0) > 0 || errno == EINTR) {
    }
    pid_ = -1;
    group_ = -1;
  }
  // SIGTERM, then waits as Wait does.
  int Stop(std::chrono::milliseconds timeout) {
    Signal(SIGTERM);
    return Wait(timeout);
  }

 private:
  pid_t pid_ = -1;
  pid_t group_ = -1;
  int pidfd_ = -1;
};

}  // namespace efa::testing
