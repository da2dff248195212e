#!/usr/bin/env python3
"""Evaluates Python expressions against a `helm template` output.

    render_query.py RENDERED.yaml EXPRESSION
    render_query.py --check RENDERED.yaml CHECKS LABEL

The first form prints the value: a string as it is, anything else as sorted
JSON (so the shell test compares text); exits 2 with the error when the
expression fails, e.g. when the object it names is not in the output.

The second reads CHECKS, records of EXPRESSION \x1f WANT \x1e, prints
"ok   - LABEL: EXPRESSION" or "FAIL - ..." with want and got for each, and
last a line "#counts PASSED FAILED" for the shell harness.

Names the expression can use:
  docs            every rendered object, in order
  obj(kind, name=None)   the one object of that kind (and name)
  kinds()         the sorted "Kind/name" of every object
  ds              the DaemonSet; pod = its pod spec; c = its first container
  mounts          the container's volumeMounts by mountPath
  volumes         the pod's volumes by name
  host_mounts     {mountPath: (hostPath, readOnly)} for every hostPath volume
  terms           the pod's required node affinity terms (nodeSelectorTerms)
  config          the daemon's config file (ConfigMap data config.yaml), parsed
  has(d, *keys)   whether the nested keys exist in d
"""
import json
import sys

import yaml


Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def show(value):
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def environment(path):
    """The names an expression can use, for the render at `path`."""
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.load_all(f, Loader=Loader) if d]

    def obj(kind, name=None):
        found = [d for d in docs if d.get("kind") == kind
                 and (name is None or d["metadata"]["name"] == name)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} objects of kind {kind}" +
                              (f" named {name}" if name else ""))
        return found[0]

    def kinds():
        return sorted(f'{d["kind"]}/{d["metadata"]["name"]}' for d in docs)

    def has(d, *keys):
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return False
            d = d[k]
        return True

    env = {"docs": docs, "obj": obj, "kinds": kinds, "has": has}
    daemonsets = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(daemonsets) == 1:
        ds = daemonsets[0]
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        host_mounts = {}
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if "hostPath" in v:
                host_mounts[m["mountPath"]] = (v["hostPath"]["path"], bool(m.get("readOnly", False)))
        terms = (pod.get("affinity", {}).get("nodeAffinity", {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms"))
        env.update(ds=ds, pod=pod, c=c, mounts=mounts, volumes=volumes, host_mounts=host_mounts,
                   terms=terms)
    # The dashboard's ConfigMap may be beside it.
    maps = [d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in d.get("data", {})]
    if len(maps) == 1:
        env["config"] = yaml.load(maps[0]["data"]["config.yaml"], Loader=Loader)
    return env


def evaluate(env, expression):
    """(True, value shown as text) or (False, the error)."""
    try:
        return True, show(eval(expression, env))  # noqa: S307 - the test's own expressions
    except Exception as e:  # pylint: disable=broad-except
        return False, f"{type(e).__name__}: {e}"


def main():
    if sys.argv[1] == "--check":
        path, checks, label = sys.argv[2], sys.argv[3], sys.argv[4]
        env = environment(path)
        with open(checks, encoding="utf-8") as f:
            records = [r for r in f.read().split("\x1e") if r]
        passed = failed = 0
        for record in records:
            expression, want = record.split("\x1f", 1)
            ok, got = evaluate(env, expression)
            if ok and got == want:
                passed += 1
                print(f"ok   - {label}: {expression}")
            else:
                failed += 1
                print(f"FAIL - {label}: {expression}\n       want: {want}\n       got:  {got}")
        print(f"#counts {passed} {failed}")
        return
    ok, out = evaluate(environment(sys.argv[1]), sys.argv[2])
    print(out, file=sys.stdout if ok else sys.stderr)
    sys.exit(0 if ok else 2)


if __name__ == "__main__":
    main()
