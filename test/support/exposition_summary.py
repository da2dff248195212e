#!/usr/bin/python3
"""Reads a Prometheus text exposition with the Python prometheus_client
parser (Debian's python3-prometheus-client, independent of prometheus-cpp)
and prints it in a canonical form, sorted, for a test to compare:

  exposition_summary.py FILE            each family: name, type, HELP, its
                                        series without values (a histogram's
                                        le values apart, in one line)
  exposition_summary.py --values FILE   every sample with its value

A malformed exposition makes the parser raise: exit status 1.
"""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def labels(sample, skip_le):
    items = sorted((k, v) for k, v in sample.labels.items() if not (skip_le and k == "le"))
    if skip_le and "le" in sample.labels:
        items.append(("le", "*"))
    return ",".join(f"{k}={json.dumps(v)}" for k, v in items)


def main():
    values = sys.argv[1] == "--values"
    with open(sys.argv[-1], encoding="utf-8") as f:
        families = sorted(text_string_to_metric_families(f.read()), key=lambda f: f.name)
    for family in families:
        if values:
            for s in sorted(family.samples, key=lambda s: (s.name, labels(s, False))):
                print(f"{s.name}{{{labels(s, False)}}} {s.value!r}")
            continue
        print(f"{family.name} {family.type} {json.dumps(family.documentation)}")
        for series in sorted({f"{s.name}{{{labels(s, True)}}}" for s in family.samples}):
            print(f"  {series}")
        bounds = {s.labels["le"] for s in family.samples if "le" in s.labels}
        if bounds:
            print("  le: " + " ".join(sorted(bounds, key=float)))


if __name__ == "__main__":
    main()
