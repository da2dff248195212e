// Measure 6: a device removed from sysfs until the kubelet reads it
// Unhealthy, and a kubelet restart until the daemon registered again, on
// the p5 node, against when inotify and the kubelet see them.
#include <sys/inotify.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "test/bench/bench.h"

namespace efa::bench {

namespace {

// Waits until the kubelet's latest list shows `id` with `health`.
bool WaitHealth(Bench& bench, const std::string& id, const std::string& health) {
  return bench.kubelet.WaitForDevices(
      kEfa,
      [&](const std::vector<v1beta1::Device>& devices) {
        return std::any_of(devices.begin(), devices.end(), [&](const v1beta1::Device& d) {
          return d.id() == id && d.health() == health;
        });
      },
      kDeadline);
}

}  // namespace

// 6. A device's verbs entry deleted from sysfs until the kubelet reads it
// Unhealthy; a kubelet restart until the daemon registered again.
void MeasureEvents(Bench& bench) {
  const std::string id = bench.ids.back();
  const fs::path classes = bench.p5.sys() / "class/infiniband";
  const fs::path entry = classes / id;
  const fs::path target = fs::read_symlink(entry);
  std::vector<double> unhealthy, noticed;
  for (int i = 0; i < bench.settings.events; ++i) {
    DirectoryWatch watch(classes, IN_DELETE);
    const auto start = Clock::now();
    fs::remove(entry);
    if (!watch.Wait(kDeadline)) Fail(classes.string() + ": inotify reported no deletion");
    noticed.push_back(Seconds(Clock::now() - start));
    if (!WaitHealth(bench, id, "Unhealthy")) Fail(id + " was not reported Unhealthy within 10 s");
    unhealthy.push_back(Seconds(Clock::now() - start));
    fs::create_directory_symlink(target, entry);
    if (!WaitHealth(bench, id, "Healthy")) Fail(id + " was not reported Healthy again within 10 s");
  }
  bench.rows.push_back({6,
                        absl::StrFormat("device removed → Unhealthy in ListAndWatch (worst of %d)",
                                        bench.settings.events),
                        WorstAndMedian(unhealthy), "inotify reports it: " + WorstAndMedian(noticed),
                        Max(unhealthy) / Max(noticed), "≤ 1 s", Max(unhealthy) <= 1.0});

  std::vector<double> registered, serving;
  for (int i = 0; i < bench.settings.events; ++i) {
    const int before = bench.kubelet.registrations(kEfa);
    const auto start = Clock::now();
    if (auto s = bench.kubelet.Restart(); !s.ok()) Fail(std::string(s.message()));
    serving.push_back(Seconds(Clock::now() - start));
    if (!bench.kubelet.WaitForRegistrations(kEfa, before + 1, kDeadline)) {
      Fail("the daemon did not register again within 10 s of a kubelet restart");
    }
    registered.push_back(Seconds(Clock::now() - start));
    if (!bench.kubelet.WaitForStreaming(kEfa, true, kDeadline))
      Fail("no ListAndWatch after restart");
  }
  bench.rows.push_back(
      {6,
       absl::StrFormat("kubelet restarted → registered again (worst of %d)", bench.settings.events),
       WorstAndMedian(registered), "the kubelet serves again: " + WorstAndMedian(serving),
       Max(registered) / Max(serving), "≤ 1 s", Max(registered) <= 1.0});
}

}  // namespace efa::bench
