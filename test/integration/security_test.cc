// What the running daemon exposes: the sockets it listens on and the
// permissions of what it writes.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test/support/devices.h"
#include "test/support/test_node.h"

namespace fs = std::filesystem;
using efa::testing::DaemonRun;
using efa::testing::kDeadline;
using efa::testing::kEfa;
using efa::testing::TestNode;

namespace {

// The socket inodes a process holds open ("socket:[123]" links under fd/).
std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> inodes;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  return inodes;
}

// Listening sockets of `inodes`: "tcp 127.0.0.1:PORT" (hex as the kernel
// writes them) and "unix PATH".
std::vector<std::string> Listeners(const std::set<std::string>& inodes) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) out.push_back("tcp " + local);
    }
  }
  std::ifstream in("/proc/net/unix");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    // Num RefCount Protocol Flags Type St Inode [Path]; flags 00010000 = listening.
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    f >> num >> refs >> proto >> flags >> type >> st >> inode >> path;
    if (flags == "00010000" && inodes.count(inode)) out.push_back("unix " + path);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "The daemon listens only on its plugin socket and the metrics and probe addresses, and "
    "writes nothing others may change",
    "[security][process][concurrency]") {
  TestNode node({.machine = "p4d.24xlarge", .run = DaemonRun::kLater});
  const auto before = fs::file_time_type::clock::now();
  node.StartBinary({"--log-level", "warn", "--metrics-address", "127.0.0.1:0", "--probe-address",
                    "127.0.0.1:0"});
  REQUIRE(node.kubelet().WaitForRegistrations(kEfa, 1, kDeadline));
  REQUIRE(node.kubelet().WaitForStreaming(kEfa, true, kDeadline));

  const auto listeners = Listeners(SocketInodes(node.pid()));
  const fs::path plugin_socket = node.device_plugin_dir() / "efa/aws-efa-device-plugin.sock";
  CAPTURE(listeners);
  REQUIRE(listeners.size() == 3);
  std::set<std::string> kinds;
  for (const auto& l : listeners) {
    if (l.rfind("unix ", 0) == 0) {
      CHECK(l == "unix " + plugin_socket.string());
    } else {
      CHECK(l.rfind("tcp 0100007F:", 0) == 0);  // 127.0.0.1, as configured
    }
    kinds.insert(l.substr(0, 3));
  }
  CHECK(kinds == std::set<std::string>{"tcp", "uni"});

  // The plugin socket: owner only (the kubelet runs as root).
  struct stat st {};
  REQUIRE(::stat(plugin_socket.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // Nothing the daemon created or changed under the node is writable by others.
  for (const auto& e : fs::recursive_directory_iterator(node.sim().path())) {
    if (e.is_symlink() || e.path() == node.log()) continue;
    std::error_code ec;
    if (fs::last_write_time(e.path(), ec) < before) continue;
    INFO(e.path());
    CHECK((e.status().permissions() & fs::perms::others_write) == fs::perms::none);
  }
}
