#!/usr/bin/env python3
"""`promtool check metrics` (Prometheus's naming lint: base units, _total
on counters, ...) on real scrapes: the daemon serving a simulated p5.48xlarge
with a container holding EFAs (so that the per-container families have
series), and the idle process on a simulated node without EFA.

Then a daemon on a simulated p5.48xlarge under each alignment mode, before
any event (no kubelet, so no Allocate, no PreStartContainer): every counter
an alert reads with increase() or rate() must already have a series for
each selector of the rules, or Prometheus misses the first burst after
each start (a series born at its first event with that event's count is no
increase); those of an option (late binding's, claimLookup's) where it is on. The selectors are read from the rules file itself. The efa
driver's own counters (HELP "... The efa driver's <name> counter...") are
the device's, not the process's: their series start at the device's count
at the daemon's first read of them (a scrape before the first scan reads no
EFA), and only where the driver has them; they are checked in the scrape of
the p5 (efa driver 3.1.0) once its counters were read.

    check_metrics_test.py DAEMON EFA_SIMNODE FAKE_KUBELET

Exits 77 (skipped) when promtool is not installed."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from simnode import Binaries, SimNode, read, wait_for

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "../../helm/aws-efa-k8s-device-plugin/files/efa-device-plugin.rules.yaml")


def counter_selectors(rules_text):
    """(name, [(label, op, value)]) of each series selector inside
    increase() or rate() in the rules."""
    out = []
    for m in re.finditer(r"\b(?:increase|rate)\((efa_device_plugin_\w+)(?:\{([^}]*)\})?\[",
                         rules_text):
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', m.group(2) or "")
        out.append((m.group(1), matchers))
    return out


def driver_counters(text):
    """The families of `text` that are the efa driver's counters, by their
    HELP text."""
    return set(re.findall(r"^# HELP (\w+) .*The efa driver's \w+ counter", text, re.M))


def parse_series(text):
    """{(name, frozenset(labels.items())): value} of an exposition."""
    series = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            series[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return series


def matches(labels, matchers):
    ops = {"=": lambda v, x: v == x, "!=": lambda v, x: v != x,
           "=~": lambda v, x: re.fullmatch(x, v) is not None,
           "!~": lambda v, x: re.fullmatch(x, v) is None}
    return all(ops[op](labels.get(label, ""), value) for label, op, value in matchers)


def check_counters_before_events(name, text, selectors, when="before any event"):
    """Each selector matches a series of `text` (a scrape before any event)."""
    series = parse_series(text)
    for metric, matchers in selectors:
        found = {",".join(f"{k}={v}" for k, v in sorted(labels)): value
                 for (n, labels), value in series.items()
                 if n == metric and matches(dict(labels), matchers)}
        if not found:
            raise AssertionError(f"{name}: no series of {metric}{matchers} {when} "
                                 f"(increase() would miss the first one):\n{text}")
        print(f"ok   - {name}: {metric}{{{','.join(l + o + repr(v) for l, o, v in matchers)}}} "
              f"exported {when}: {found}")
    return series


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
        # The counters of the alerts, at a start: (alignment mode, what must
        # be 0 then besides being present). The efa driver's: on the p5,
        # read.
        selectors = counter_selectors(read(RULES))
        driver = driver_counters(text)
        assert "efa_device_plugin_efa_unresponsive_remote_events_total" in driver, driver
        assert "efa_device_plugin_efa_allocations_total" not in driver, driver
        of_driver = [(m, sel) for m, sel in selectors if m in driver]
        assert of_driver, selectors
        check_counters_before_events("serving p5.48xlarge (efa driver 3.1.0)", text, of_driver,
                                     when="once its counters were read")
        selectors = [(m, sel) for m, sel in selectors if m not in driver]
        assert any(m == "efa_device_plugin_allocations_total" for m, _ in selectors), selectors
        assert any(m == "efa_device_plugin_late_binding_total" for m, _ in selectors), selectors
        for mode in ("best-effort", "late-binding"):
            node_work = os.path.join(work, mode)
            os.makedirs(node_work)
            # claimLookup's counters exist only where it is on: on with
            # best effort (no claim here, so no lookup is made).
            lookup = mode == "best-effort"
            with SimNode(bins, "p5.48xlarge", node_work,
                         daemon_flags=["--alignment", mode] +
                         (["--claim-lookup"] if lookup else [])) as fresh:
                fresh.wait_log("serving /metrics")
                text = wait_for("the serving daemon's scrape", lambda: (
                    lambda t: t if 'mode="serving"' in t else "")(fresh.scrape()))
                wanted = [(m, sel) for m, sel in selectors
                          if (mode == "late-binding" or m != "efa_device_plugin_late_binding_total")
                          and (lookup or m != "efa_device_plugin_claim_lookup_errors_total")]
                series = check_counters_before_events(f"fresh p5.48xlarge, {mode}", text, wanted)
                zero = [('efa_device_plugin_allocations_total', 'INVALID_ARGUMENT'),
                        ('efa_device_plugin_allocations_total', 'FAILED_PRECONDITION')]
                if mode == "late-binding":
                    zero.append(('efa_device_plugin_late_binding_total', 'failed'))
                for metric, value in zero:
                    label = "event" if metric.endswith("late_binding_total") else "code"
                    got = series.get((metric, frozenset({(label, value)})))
                    if got != 0:
                        raise AssertionError(f"{mode}: {metric}{{{label}={value!r}}} is {got}, "
                                             f"not 0, before any event")
                if lookup and series.get(("efa_device_plugin_claim_lookup_errors_total",
                                          frozenset())) != 0:
                    raise AssertionError(f"{mode}: claim_lookup_errors_total is not 0 at start")
        with SimNode(bins, "m5.8xlarge", work) as idle:
            idle.wait_log("no EFA on this node; idle until one appears")
            wait_for("the idle process's /metrics", idle.metrics_port)
            check("idle m5.8xlarge", idle.scrape(),
                  ['mode="idle"', "efa_device_plugin_efas_found 0",
                   'efa_device_plugin_devices{health="healthy"} 0'])
    return 0


if __name__ == "__main__":
    sys.exit(main())
