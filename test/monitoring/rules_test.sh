#!/usr/bin/env bash
# The alert rules checked and unit-tested by Debian's promtool: every alert
# firing and not firing (idle node, counter reset after a restart, the
# first error after a restart, a node yielding to the DRA driver).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
rules="$here/../../helm/aws-efa-k8s-device-plugin/files/efa-device-plugin.rules.yaml"
if ! command -v promtool >/dev/null; then
  echo "skip - promtool not found (Debian package prometheus; scripts/install-deps.sh installs it)"
  exit 77
fi
promtool check rules "$rules"
cd "$here" && promtool test rules rules_test.yaml

# The dashboard: valid JSON, every query parsed by promtool, only exported series.
dashboard="$here/../../helm/aws-efa-k8s-device-plugin/files/efa-device-plugin.dashboard.json"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
python3 "$here/dashboard_exprs.py" "$dashboard" "$here/../../docs/observability.md" "$here/../../docs/metrics.md" \
  >"$tmp/dashboard.rules.json"
promtool check rules "$tmp/dashboard.rules.json"

# The alert rules name only series the metrics tables (docs/observability.md,
# docs/metrics.md) list.
python3 - "$rules" "$here/../../docs/observability.md" "$here/../../docs/metrics.md" <<'PY'
import re, sys
known = [n for doc in sys.argv[2:]
         for n in re.findall(r"^\| `(efa_device_plugin_[a-z_<>]+)`", open(doc).read(), re.M)]
pats = [re.compile("^" + re.sub(r"<\w+>", "[a-z_]+", k) + "$") for k in known]
bad = {n for n in re.findall(r"efa_device_plugin_[a-z_]+", open(sys.argv[1]).read())
       if not any(p.match(n) for p in pats)}
if bad:
    sys.exit(f"{sys.argv[1]}: series not exported by the daemon: {sorted(bad)}")
print("rules: every series is exported")
PY

# Every alert is seen firing by a promtool test, listed in docs/observability.md's alert
# table and has its section in docs/runbook.md (the runbook_url anchors);
# no alert names the repository that does not exist.
python3 - "$rules" "$here/rules_test.yaml" "$here/../../docs/observability.md" "$here/../../docs/runbook.md" <<'PY'
import re, sys
import yaml
rules = open(sys.argv[1]).read()
alerts = re.findall(r"^\s+- alert: (\w+)$", rules, re.M)
# Tested: seen firing (a non-empty exp_alerts) by some test.
tested = {c["alertname"] for t in yaml.safe_load(open(sys.argv[2]))["tests"]
          for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
table = re.findall(r"^\| `(Efa\w+)` \|", open(sys.argv[3]).read(), re.M)
sections = re.findall(r"^## (\w+)$", open(sys.argv[4]).read(), re.M)
problems = []
if set(alerts) - tested:
    problems.append(f"no promtool test sees {sorted(set(alerts) - tested)} fire")
if table != alerts:
    problems.append(f"{sys.argv[3]}: the alert table lists {table}, the rules {alerts}")
if sorted(sections) != sorted(alerts):
    problems.append(f"{sys.argv[4]}: sections {sorted(sections)}, alerts {sorted(alerts)}")
if "github.com/aws/" in rules:
    problems.append(f"{sys.argv[1]}: links github.com/aws/, which publishes no such project")
if problems:
    sys.exit("\n".join(problems))
print(f"rules: each of the {len(alerts)} alerts is tested, in the docs' table and in the runbook")
PY

# docs/dashboard.md lists exactly the dashboard's panels and queries, in order.
python3 - "$dashboard" "$here/../../docs/dashboard.md" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
want = [(p["title"], [t["expr"] for t in p["targets"]]) for p in d["panels"]]
doc = open(sys.argv[2]).read()
got = []
for section in re.split(r"^## ", doc, flags=re.M)[1:]:
    title, _, body = section.partition("\n")
    block = re.search(r"```promql\n(.*?)```", body, re.S)
    got.append((title, block.group(1).strip().splitlines() if block else []))
if got != want:
    sys.exit(f"{sys.argv[2]}: the panels and queries differ from {sys.argv[1]}:\n"
             f"want {want}\ngot  {got}")
print(f"dashboard: {sys.argv[2]} lists its {len(want)} panels")
PY
