#include "topology/uevents.h"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string_view>

#include "topology/sysfs.h"

namespace efa::topology {

int OpenUeventSocket() {
  int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_KOBJECT_UEVENT);
  if (fd < 0) return -1;
  sockaddr_nl addr{};
  addr.nl_family = AF_NETLINK;
  addr.nl_groups = 1;  // the kernel's multicast group
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool DrainUevents(int fd) {
  bool relevant = false;
  char buf[8192];
  while (true) {
    ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) break;
    buf[n] = '\0';
    for (ssize_t i = 0; i < n; i += static_cast<ssize_t>(std::strlen(buf + i)) + 1) {
      std::string_view field(buf + i);
      if (field == "SUBSYSTEM=infiniband" || field == "SUBSYSTEM=infiniband_verbs" ||
          field == "SUBSYSTEM=pci") {
        relevant = true;
      }
    }
  }
  return relevant;
}

std::string UeventSeqnum(const std::filesystem::path& sysfs_root) {
  return ReadAttribute(sysfs_root / "kernel/uevent_seqnum").value_or("");
}

}  // namespace efa::topology
