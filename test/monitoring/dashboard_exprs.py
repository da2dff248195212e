#!/usr/bin/env python3
"""Prints the dashboard's PromQL as a rules file (one recording rule per
expression, Grafana variables replaced by ".*") so `promtool check rules`
parses every query; fails when the JSON is invalid or a query names a
series that the metrics tables (docs/observability.md, docs/metrics.md) do not list."""
import json
import re
import sys

dashboard, docs = sys.argv[1], sys.argv[2:]
d = json.load(open(dashboard))
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
exprs += [re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]["query"])
          for v in d["templating"]["list"] if v["type"] == "query"]
known = {n for doc in docs
         for n in re.findall(r"^\| `(efa_device_plugin_[a-z_<>]+)`", open(doc).read(), re.M)}
patterns = [re.compile("^" + re.sub(r"<\w+>", "[a-z_]+", k) + "$") for k in known]
bad = [n for e in exprs for n in re.findall(r"efa_device_plugin_[a-z_]+", e)
       if not any(p.match(n) for p in patterns)]
if bad:
    sys.exit(f"{dashboard}: series not exported by the daemon: {sorted(set(bad))}")
rules = [{"record": f"dashboard:expr{i}", "expr": e.replace("$cluster", ".*")
          .replace("$node", ".*").replace("$namespace", ".*")} for i, e in enumerate(exprs)]
print(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
