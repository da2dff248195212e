// What a running process costs, read from /proc/<pid>: resident memory, CPU
// time and context switches (wake-ups).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

namespace efa::testing {

// A field "Name:   123 ..." of /proc/<pid>[/task/<tid>]/status; -1 if absent.
inline long long StatusField(const std::filesystem::path& status, const std::string& name) {
  std::ifstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + ":") == 0) {
      return std::stoll(line.substr(name.size() + 1));
    }
  }
  return -1;
}

// VmRSS in KiB; -1 when the process is gone.
inline long long ResidentKiB(pid_t pid) {
  return StatusField("/proc/" + std::to_string(pid) + "/status", "VmRSS");
}

// utime + stime of the whole process (threads that ended included), in
// seconds; the kernel counts them in clock ticks (usually 10 ms).
inline double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The fields after the command name, which may hold spaces: state is
  // field 3, utime and stime are fields 14 and 15.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i < 14; ++i) rest >> field;
  long long utime = 0, stime = 0;
  rest >> utime >> stime;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU time of the threads alive now, summed from /proc/<pid>/task/*/schedstat
// (nanoseconds, where utime + stime count 10 ms ticks), in seconds. Threads
// that ended are not counted: compare readings of long-lived threads.
inline double ThreadsCpuSeconds(pid_t pid) {
  double total = 0;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "schedstat");
    long long ns = 0;
    if (in >> ns) total += static_cast<double>(ns) * 1e-9;
  }
  return total;
}

// CPU time of one thread (schedstat, ns precision), in seconds; 0 if gone.
inline double ThreadCpuSeconds(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/schedstat");
  long long ns = 0;
  in >> ns;
  return static_cast<double>(ns) * 1e-9;
}

// Threads of the process now; -1 when it is gone.
inline long long ThreadCount(pid_t pid) {
  return StatusField("/proc/" + std::to_string(pid) + "/status", "Threads");
}

// One thread's name and its voluntary + involuntary context switches: each
// time it sleeps and is woken counts one.
struct ThreadSwitches {
  std::string name;
  long long switches = 0;
  long long voluntary = 0;  // of those, the times it slept and was woken
};

// Every thread of the process, by thread ID.
inline std::map<pid_t, ThreadSwitches> ContextSwitches(pid_t pid) {
  std::map<pid_t, ThreadSwitches> threads;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const long long v = StatusField(task.path() / "status", "voluntary_ctxt_switches");
    const long long n = StatusField(task.path() / "status", "nonvoluntary_ctxt_switches");
    if (v < 0 || n < 0) continue;  // the thread just ended
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    threads[std::stoi(task.path().filename().string())] = {name, v + n, v};
  }
  return threads;
}

// Switches between two readings, by thread name: the growth of each thread
// present in both, plus every switch of threads that started in between
// (threads that ended in between are not counted: their counts are gone).
inline std::map<std::string, long long> SwitchesBetween(
    const std::map<pid_t, ThreadSwitches>& before, const std::map<pid_t, ThreadSwitches>& after) {
  std::map<std::string, long long> by_name;
  for (const auto& [tid, thread] : after) {
    auto it = before.find(tid);
    by_name[thread.name] += thread.switches - (it == before.end() ? 0 : it->second.switches);
  }
  return by_name;
}

}  // namespace efa::testing
