// The efa driver's own counters, read from sysfs: what the device moved and
// how its admin queue fares, for metrics, idle detection and device health.
//
// What is relied on, from the efa driver (amzn-drivers kernel/linux/efa
// 3.1.0, src/efa_verbs.c, efa_main.c, efa_com.c, efa_admin_cmds_defs.h;
// upstream drivers/infiniband/hw/efa has the same names) and the RDMA core
// (drivers/infiniband/core/sysfs.c, include/rdma/ib_verbs.h):
//
// - Device counters (EFA_DEFINE_DEVICE_STATS) are in
//   <sysfs>/class/infiniband/<ibdev>/hw_counters/<name>, port counters
//   (EFA_DEFINE_PORT_STATS) in .../ports/1/hw_counters/<name>, one decimal
//   u64 per file ("%llu\n"). Before "RDMA/efa: Split hardware stats to device
//   and port stats" (patch of 12 July 2021, for Linux 5.15) both
//   directories held every counter, so each is read from its own directory
//   on every kernel. A counter the running driver does not have has no file
//   (amzn-drivers RELEASENOTES.md: the device statistics came with efa
//   r1.4.0, cmds_err with r1.9.0, the messages and RDMA read counters with
//   r1.10.1, RDMA write with r2.5.0, the network counters with r2.17.0):
//   that is normal, not an error.
// - Cost of a read: reading any file of a group calls the driver's
//   get_hw_stats for the whole group unless it ran within the group's
//   lifespan, RDMA_HW_STATS_DEFAULT_LIFESPAN = 10 ms (update_hw_stats in
//   core/sysfs.c). For the port group that is efa_fill_port_stats: one
//   EFA_ADMIN_GET_STATS admin command per type (basic, messages, RDMA read,
//   RDMA write when the device has it, network), so reading the port files
//   back to back costs one round of 4-5 admin commands per EFA. The device
//   group (efa_fill_device_stats) only copies the driver's atomics: no
//   admin command. Hence: read on a scrape, at most once per interval.
// - tx_bytes/rx_bytes/rx_drops come from the device's basic statistics
//   (efa_admin_basic_stats); that they count all traffic, RDMA included, is
//   inferred (the driver passes them through without a word).
//   send_bytes/recv_bytes come from the messages statistics (two-sided
//   SEND/RECV), rdma_read_bytes/rdma_write_bytes from the RDMA read and
//   write statistics as requester (rdma_read_resp_bytes and
//   rdma_write_recv_bytes, not read here, as responder); *_wr_err count the
//   failed work requests of that kind.
// - keep_alive_rcvd is incremented by the driver on each keep-alive event
//   the device posts to its async event queue (efa_keep_alive in efa_main.c,
//   AENQ group EFA_ADMIN_KEEP_ALIVE, enabled at probe). The driver sets no
//   period and has no watchdog of its own: the interval is the device's.
// - submitted_cmds/completed_cmds count admin commands; cmds_err those that
//   failed, whatever the cause (a device error status, including a user's
//   create_qp or reg_mr the device refused, or a closed admin queue);
//   no_completion_cmds those the device never completed within the admin
//   timeout, after which the driver closes the admin queue
//   (efa_com_wait_and_process_admin_cq_*: clear_bit RUNNING): every later
//   admin command, the port counters' GET_STATS included, fails with ENODEV.
// - create_qp_err and reg_mr_err count failed queue-pair creations and
//   memory registrations (a process that cannot create either cannot use
//   the EFA, and libfabric may fall back to another provider).
// - The network counters, retrans_bytes, retrans_pkts,
//   retrans_timeout_events, unresponsive_remote_events and
//   impaired_remote_conn_events, are the device's network statistics
//   (efa_admin_network_stats, one EFA_ADMIN_GET_STATS of type NETWORK, the
//   last of efa_fill_port_stats), port counters like the traffic ones. They
//   came with amzn-drivers commit 8ef8bcd "linux/efa: Add Network HW
//   statistics counters", released in efa r2.17.0 (RELEASENOTES.md: "Add
//   Network HW statistics counters"): a driver before it has no such
//   files (checked in amzn-drivers only, not in upstream Linux). The driver
//   passes the values through without a word; what they count is inferred
//   from their names and the driver's SRD.txt and efa_io_defs.h: the SRD
//   requester resends lost packets (retrans_bytes, retrans_pkts) and times
//   out waiting for acknowledgements (retrans_timeout_events); SRD.txt's
//   "Remote Unresponsive Event" is "the local transport timeout was
//   exceeded while trying to send messages to a specific destination (AH)"
//   (unresponsive_remote_events); impaired_remote_conn_events, from its
//   name alone, counts connections to a peer the device found degraded.
//   They count what this EFA saw of its peers and of the network path to
//   them, not a fault of this device.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace efa::topology {

// One counter the daemon reads.
struct EfaCounter {
  const char* name;    // the file name, as the driver names it
  bool port;           // in ports/1/hw_counters (else hw_counters)
  bool per_container;  // also shown per container holding the EFA
  const char* help;
};

// The counters read, in exposition order. Thread-safe.
const std::vector<EfaCounter>& EfaCounters();
// The index of `name` in EfaCounters(); -1 when it is not read.
int EfaCounterIndex(std::string_view name);

struct EfaCounterValues {
  // By index of EfaCounters(); nullopt when missing or unreadable.
  std::vector<std::optional<uint64_t>> values;
  int missing = 0;  // files that do not exist (a driver without them)
  // Files whose read() the device answered with an error (the driver's
  // get_hw_stats failed), each message naming the file: "<path>: No such
  // device" once its admin queue is closed, ETIME, EIO.
  std::vector<std::string> errors;
  // Files not read for a reason that says nothing about the device, each
  // message naming the file: the daemon out of descriptors or memory, a
  // read cut short (IsHostResourceError), a file that cannot be opened
  // (other than ENOENT) or is not a counter (a directory, garbage).
  std::vector<std::string> unreadable;
  std::optional<uint64_t> Get(std::string_view name) const;
};

// Reads every counter of EfaCounters() for `ibdev` under `sysfs_root`, each
// file through ReadFileBounded, sorting what fails into missing, errors
// and unreadable. Never fails as a whole. Thread-safe.
EfaCounterValues ReadEfaCounters(const std::filesystem::path& sysfs_root, const std::string& ibdev);

}  // namespace efa::topology
