#!/usr/bin/env python3
"""A real Prometheus server (Debian's prometheus) scrapes the real daemon on
a simulated p5.48xlarge (with the fake kubelet, one container holding 4
EFAs), the daemon on a simulated g5.48xlarge (an efa driver older than
r2.17.0, one container holding its EFA) and the idle process on a simulated
node without EFA, every second, with the shipped alert rules loaded:

- the efa driver's network counters are scraped per EFA and per container
  from the p5, and none of them from the g5, whose other counters are;
- a peer of one of the p5 container's EFAs stops responding
  (unresponsive_remote_events rises): EfaRemotePeersImpaired fires for the
  p5; nothing is ever pending or firing for the g5;

- an EFA removed from the p5 makes EfaDevicesUnhealthy fire on
  /api/v1/alerts, naming it, and it resolves when the EFA returns;
- nothing is ever pending or firing for the node without EFA, although
  its instance type (g5.48xlarge, given) can have an EFA: efas_expected 1,
  efas_found 0, as on a g5 launched without one;
- every query of the shipped dashboard returns data (/api/v1/query) for
  the p5's cluster (each node is given a cluster label of its own);
- once the p5's daemon stops, EfaDevicePluginScrapeFailing fires for it
  (the scrape job is the one the rules name, efa-device-plugin).

The rules file is not templated, so the test loads a copy whose `for:`
durations are all shortened to FOR (3 s); the expressions are the file's.

    prometheus_test.py DAEMON EFA_SIMNODE FAKE_KUBELET

Exits 77 (skipped) when prometheus is not installed."""
import calendar
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

from simnode import Binaries, SimNode, http_get, read, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = os.path.join(HERE, "../../helm/aws-efa-k8s-device-plugin/files")
RULES = os.path.join(FILES, "efa-device-plugin.rules.yaml")
DASHBOARD = os.path.join(FILES, "efa-device-plugin.dashboard.json")
FOR = "3s"
# The efa driver's network counters (r2.17.0 and later).
NETWORK_COUNTERS = ("retrans_bytes", "retrans_pkts", "retrans_timeout_events",
                    "unresponsive_remote_events", "impaired_remote_conn_events")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shortened_rules(path):
    text, n = re.subn(r"^(\s+for:) \S+$", rf"\1 {FOR}", read(RULES), flags=re.M)
    assert n > 0, f"{RULES}: no `for:` to shorten"
    with open(path, "w") as f:
        f.write(text)


class Prometheus:
    def __init__(self, work, targets):
        self.work, self.targets, self.proc = work, targets, None

    def __enter__(self):
        config = os.path.join(self.work, "prometheus.yml")
        shortened_rules(os.path.join(self.work, "rules.yaml"))
        # Each node in a cluster of its own, so that the dashboard is read
        # for the working node's cluster alone.
        static = "\n".join(f"      - targets: ['127.0.0.1:{port}']\n"
                           f"        labels: {{node: {node}, cluster: {node}-cluster}}"
                           for node, port in self.targets.items())
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
  - job_name: efa-device-plugin
    static_configs:
{static}
""")
        log = os.path.join(self.work, "prometheus.log")
        self.port = free_port()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={self.work}/data",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{read(log)}")
            try:
                return "Ready" in http_get(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
            except OSError:
                return False
        wait_for("prometheus to be ready", ready, deadline=30)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return False

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        reply = json.loads(http_get(url))
        assert reply["status"] == "success", f"{url}: {reply}"
        return reply["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def alerts(self, name=None, node=None, state=None):
        return [a for a in self.api("alerts")["alerts"]
                if (name is None or a["labels"]["alertname"] == name)
                and (node is None or a["labels"].get("node") == node)
                and (state is None or a["state"] == state)]

    def evaluated_since(self, when):
        """Whether every rule group was evaluated after `when` (epoch s)."""
        groups = self.api("rules")["groups"]
        return groups and all(parse_time(g["lastEvaluation"]) > when for g in groups)


def parse_time(rfc3339):
    # e.g. 2026-12-05T19:40:01.123456789Z (UTC): seconds are enough here.
    return calendar.timegm(time.strptime(rfc3339[:19], "%Y-%m-%dT%H:%M:%S"))


def dashboard_queries():
    d = json.load(open(DASHBOARD))
    out = [(f'{p["title"]} [{t["refId"]}]', t["expr"]) for p in d["panels"] for t in p["targets"]]
    out += [(f"variable {v['name']}",
             re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]["query"]))
            for v in d["templating"]["list"] if v["type"] == "query"]
    # The working node's cluster; every node and namespace (Grafana's "All").
    values = {"cluster": "p5-cluster", "node": ".*", "namespace": ".*"}
    return [(title, re.sub(r"\$(cluster|node|namespace)", lambda m: values[m.group(1)], expr))
            for title, expr in out]


def main():
    if not shutil.which("prometheus"):
        print("skip - prometheus not found (Debian package prometheus)")
        return 77
    bins = Binaries(*sys.argv[1:4])
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as work, \
            SimNode(bins, "p5.48xlarge", work, admit=4,
                    daemon_flags=["--counter-interval", "1s"]) as p5, \
            SimNode(bins, "g5.48xlarge", work, admit=1,
                    daemon_flags=["--counter-interval", "1s"]) as g5, \
            SimNode(bins, "m5.8xlarge", work,
                    daemon_flags=["--instance-type", "g5.48xlarge"]) as idle:
        p5.wait_admitted()
        g5.wait_admitted()
        idle.wait_log("no EFA on this node; idle until one appears")
        targets = {"p5": wait_for("the daemon's port", p5.metrics_port),
                   "g5": wait_for("the g5 daemon's port", g5.metrics_port),
                   "idle": wait_for("the idle process's port", idle.metrics_port)}
        with Prometheus(work, targets) as prom:
            wait_for("every target up", lambda: sorted(
                t["labels"]["node"] for t in prom.api("targets")["activeTargets"]
                if t["health"] == "up") == ["g5", "idle", "p5"])
            print(f"ok   - prometheus {prom.port} scrapes the daemons {targets['p5']} (p5) "
                  f"and {targets['g5']} (g5) and the idle process {targets['idle']}")
            # Every node as the alerts read them, then a whole `for:` of
            # evaluations over them.
            wait_for("info of both modes", lambda: sorted(
                (s["metric"]["node"], s["metric"]["mode"])
                for s in prom.query("efa_device_plugin_info")) == [("g5", "serving"),
                                                                   ("idle", "idle"),
                                                                   ("p5", "serving")])
            since = time.time() + int(FOR[:-1]) + 1
            wait_for("the rules evaluated past a `for:`", lambda: prom.evaluated_since(since))
            assert not prom.alerts("EfaDevicesUnhealthy"), prom.alerts("EfaDevicesUnhealthy")
            print("ok   - all EFAs present: EfaDevicesUnhealthy does not fire")

            # Every panel and variable of the dashboard has data from a cluster
            # whose one node works: no panel is empty there.
            for title, expr in dashboard_queries():
                wait_for(f"data for {title!r}: {expr}", lambda e=expr: prom.query(e))
                print(f"ok   - dashboard: {title}: data")

            # The efa driver's network counters: per EFA and per container
            # where the driver has them (the p5's), none where it has not
            # (the g5's), whose traffic counters are there all the same.
            for name in NETWORK_COUNTERS:
                wait_for(f"{name} of the p5's {len(p5.efas())} EFAs", lambda n=name: len(
                    prom.query(f'efa_device_plugin_efa_{n}_total{{node="p5"}}')) == len(p5.efas()))
                wait_for(f"{name} of the p5 container's 4 EFAs", lambda n=name: len(prom.query(
                    f'efa_device_plugin_container_efa_{n}_total{{node="p5"}}')) == 4)
            wait_for("the g5 container's traffic", lambda: prom.query(
                'efa_device_plugin_container_efa_tx_bytes_total{node="g5"}'))
            for name in NETWORK_COUNTERS:
                for family in ("efa", "container_efa"):
                    found = prom.query(f'efa_device_plugin_{family}_{name}_total{{node="g5"}}')
                    assert not found, found
            missing = prom.query('efa_device_plugin_efa_counters_unavailable{node="g5"} > 0')
            assert [(s["metric"]["reason"], s["value"][1]) for s in missing] == [("missing", "5")], \
                missing
            print(f"ok   - network counters: per EFA and per container on p5, none on g5 "
                  f"(an older driver: 5 counter files missing, no error)")

            # A peer of one of the container's EFAs stops responding.
            held = prom.query('efa_device_plugin_container_efa_unresponsive_remote_events_total'
                              '{node="p5"}')[0]["metric"]["efa"]
            p5.set_port_counter(held, "unresponsive_remote_events", 2)
            wait_for(f"the container's series of {held} at 2", lambda: prom.query(
                'efa_device_plugin_container_efa_unresponsive_remote_events_total'
                f'{{node="p5",efa="{held}"}} == 2'))
            fired = wait_for("EfaRemotePeersImpaired firing for p5",
                             lambda: prom.alerts("EfaRemotePeersImpaired", "p5", "firing"))
            assert "node p5 " in fired[0]["annotations"]["description"], fired
            assert not prom.alerts("EfaDevicesUnhealthy"), prom.alerts("EfaDevicesUnhealthy")
            print(f"ok   - a peer of {held} stopped responding: EfaRemotePeersImpaired fires: "
                  f"{fired[0]['annotations']['description']}")

            # An EFA goes: Unhealthy after the daemon's rescan, firing after FOR.
            gone = p5.efas()[-1]
            p5.remove_efa(gone)
            fired = wait_for("EfaDevicesUnhealthy firing for p5",
                             lambda: prom.alerts("EfaDevicesUnhealthy", "p5", "firing"))
            assert f"({gone})" in fired[0]["annotations"]["description"], fired
            print(f"ok   - {gone} removed: EfaDevicesUnhealthy fires naming it: "
                  f"{fired[0]['annotations']['description']}")
            p5.return_efa(gone)
            wait_for("EfaDevicesUnhealthy resolved",
                     lambda: not prom.alerts("EfaDevicesUnhealthy"))
            print(f"ok   - {gone} back: EfaDevicesUnhealthy resolved")

            # No evaluation of the whole run had an alert for the idle node.
            assert not prom.query('count_over_time(ALERTS{node="idle"}[1h])'), \
                prom.query('ALERTS{node="idle"}')
            assert prom.query('efa_device_plugin_efas_found{node="idle"} == 0 and on (node) '
                              'efa_device_plugin_efas_expected{node="idle"} == 1')
            print("ok   - node without EFA: no alert pending or firing at any evaluation")
            assert not prom.query('count_over_time(ALERTS{node="g5"}[1h])'), \
                prom.query('ALERTS{node="g5"}')
            print("ok   - g5 (older driver): no alert pending or firing at any evaluation")

            # The p5's daemon stops (its target stays, as a crash-looping
            # pod's does): its scrapes fail and EfaDevicePluginScrapeFailing
            # fires for the node, read from `up` of the rules' job; the idle
            # node's target, still up, does not.
            daemon = p5.procs[-1]
            daemon.terminate()
            daemon.wait(timeout=10)
            fired = wait_for("EfaDevicePluginScrapeFailing firing for p5",
                             lambda: prom.alerts("EfaDevicePluginScrapeFailing", "p5", "firing"))
            assert not prom.alerts("EfaDevicePluginScrapeFailing", "idle"), prom.alerts()
            print(f"ok   - p5's daemon stopped: EfaDevicePluginScrapeFailing fires: "
                  f"{fired[0]['annotations']['description']}")
    print(f"prometheus_test: {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
