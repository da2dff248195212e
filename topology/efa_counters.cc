#include "topology/efa_counters.h"

#include <cerrno>
#include <charconv>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "topology/sysfs.h"

namespace efa::topology {
namespace fs = std::filesystem;

namespace {
// A counter file holds one u64 and a newline.
constexpr size_t kMaxCounterBytes = 64;
}  // namespace

// Those an operator acts on, not every counter the driver has: each is a
// series per EFA (21 x 32 on a p5.48xlarge), and packet counts, the
// responder's RDMA bytes and the other verbs errors add little to these.
// Per container: the bytes it moves, and the network counters, which tell
// which job's peers or paths to them fail (the driver counts per device,
// and the container holds the device).
const std::vector<EfaCounter>& EfaCounters() {
  static const auto* counters = new std::vector<EfaCounter>{
      // Port counters: what the EFA moved.
      {"tx_bytes", true, true, "Bytes the EFA sent (all traffic)."},
      {"rx_bytes", true, true, "Bytes the EFA received (all traffic)."},
      {"rx_drops", true, false, "Received packets the EFA dropped."},
      {"send_bytes", true, true, "Bytes of two-sided SEND operations."},
      {"recv_bytes", true, true, "Bytes of two-sided RECV operations."},
      {"rdma_read_bytes", true, true, "Bytes this EFA read remotely (RDMA read requester)."},
      {"rdma_write_bytes", true, true, "Bytes this EFA wrote remotely (RDMA write requester)."},
      {"rdma_read_wr_err", true, false, "RDMA read work requests that failed."},
      {"rdma_write_wr_err", true, false, "RDMA write work requests that failed."},
      // Network counters (efa r2.17.0 and later): the SRD transport's view
      // of the peers and the path to them.
      {"retrans_bytes", true, true, "Bytes the EFA sent again (SRD retransmissions)."},
      {"retrans_pkts", true, true, "Packets the EFA sent again (SRD retransmissions)."},
      {"retrans_timeout_events", true, true, "Retransmission timeouts."},
      {"unresponsive_remote_events", true, true, "Remote peers that stopped responding."},
      {"impaired_remote_conn_events", true, true, "Connections to remote peers found impaired."},
      // Device counters: the driver's own.
      {"keep_alive_rcvd", false, false, "Keep-alive events the device sent to the driver."},
      {"submitted_cmds", false, false, "Admin commands submitted to the device."},
      {"completed_cmds", false, false, "Admin commands the device completed."},
      {"cmds_err", false, false, "Admin commands that failed."},
      {"no_completion_cmds", false, false,
       "Admin commands the device never completed (the driver then closes its admin queue)."},
      {"create_qp_err", false, false, "Queue-pair creations that failed."},
      {"reg_mr_err", false, false, "Memory registrations that failed."},
  };
  return *counters;
}

int EfaCounterIndex(std::string_view name) {
  const auto& counters = EfaCounters();
  for (size_t i = 0; i < counters.size(); ++i) {
    if (counters[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::optional<uint64_t> EfaCounterValues::Get(std::string_view name) const {
  const int i = EfaCounterIndex(name);
  if (i < 0 || static_cast<size_t>(i) >= values.size()) return std::nullopt;
  return values[static_cast<size_t>(i)];
}

EfaCounterValues ReadEfaCounters(const fs::path& sysfs_root, const std::string& ibdev) {
  const fs::path dev = sysfs_root / "class/infiniband" / ibdev;
  EfaCounterValues out;
  for (const EfaCounter& c : EfaCounters()) {
    const fs::path path = dev / (c.port ? "ports/1/hw_counters" : "hw_counters") / c.name;
    std::optional<uint64_t>& value = out.values.emplace_back();
    absl::StatusOr<std::string> text = ReadFileBounded(path, kMaxCounterBytes);
    if (!text.ok()) {
      // By errno, not status code: ENODEV, the closed admin queue's answer,
      // is NotFound like ENOENT; ENOMEM is ResourceExhausted like a file
      // too large.
      const int err = ErrnoOf(text.status());
      if (err == ENOENT && !FailedOnRead(text.status())) {
        ++out.missing;
      } else if (FailedOnRead(text.status()) && !IsHostResourceError(err) && err != EISDIR) {
        out.errors.emplace_back(text.status().message());
      } else {
        out.unreadable.emplace_back(text.status().message());
      }
      continue;
    }
    std::string_view t = *text;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
      out.unreadable.push_back(absl::StrCat(path.string(),
                                            ": expected a counter like \"1234\", got \"",
                                            absl::CHexEscape(std::string(t.substr(0, 20))), "\""));
      continue;
    }
    value = v;
  }
  return out;
}

}  // namespace efa::topology
