#!/usr/bin/env python3
"""`promtool check metrics` (Prometheus's naming lint: base units, _total
on counters, ...) on real scrapes: the daemon serving a simulated p5.48xlarge
with a container holding EFAs (so that the per-container families have
series), and the idle process on a simulated node without EFA.

    check_metrics_test.py DAEMON EFA_SIMNODE FAKE_KUBELET

Exits 77 (skipped) when promtool is not installed."""
import shutil
import subprocess
import sys
import tempfile

from simnode import Binaries, SimNode, wait_for


def check(name, text, must_hold):
    for series in must_hold:
        if series not in text:
            raise AssertionError(f"{name}: the scrape lacks {series}:\n{text}")
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                          capture_output=True)
    if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
        raise AssertionError(f"{name}: promtool check metrics (exit {lint.returncode}):\n"
                             f"{lint.stdout}{lint.stderr}")
    families = sum(line.startswith("# TYPE ") for line in text.splitlines())
    print(f"ok   - {name}: promtool check metrics: clean ({families} families)")


def main():
    if not shutil.which("promtool"):
        print("skip - promtool not found (Debian package prometheus)")
        return 77
    bins = Binaries(*sys.argv[1:4])
    with tempfile.TemporaryDirectory() as work:
        with SimNode(bins, "p5.48xlarge", work, admit=4,
                     daemon_flags=["--counter-interval", "100ms"]) as p5:
            p5.wait_admitted()
            # The per-container families have series once the daemon has read
            # pod-resources after the admission.
            text = wait_for("the container's series in a scrape",
                            lambda: (lambda t: t if "container_idle_efas{" in t else "")(
                                p5.scrape()))
            check("serving p5.48xlarge", text,
                  ['efa_device_plugin_info{version="', 'mode="serving"',
                   "efa_device_plugin_container_efa_tx_bytes_total{",
                   "efa_device_plugin_rpc_duration_seconds_bucket{"])
        with SimNode(bins, "m5.8xlarge", work) as idle:
            idle.wait_log("no EFA on this node; idle until one appears")
            wait_for("the idle process's /metrics", idle.metrics_port)
            check("idle m5.8xlarge", idle.scrape(),
                  ['mode="idle"', "efa_device_plugin_efas_found 0",
                   'efa_device_plugin_devices{health="healthy"} 0'])
    return 0


if __name__ == "__main__":
    sys.exit(main())
