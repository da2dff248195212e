#!/usr/bin/env python3
"""Checks that every #include "..." of the daemon's sources points down.

Usage: scripts/check-layering.py [REPO_ROOT]

The layers, top to bottom (ARCHITECTURE.md, "Folders"): plugin/ (the daemon,
its service, config and main), plugin/ops/, plugin/alignment/ and
plugin/guards/ (which do not include each other), plugin/kubelet/,
plugin/runtime/ (the ground floor of plugin/), topology/, and the generated
kubelet APIs (proto/: included as "deviceplugin/..." and "podresources/...").
A file may include its own folder and the folders below it. plugin/runtime/
and topology/ see no kubelet: no generated proto header, no gRPC or
protobuf. The idle binary (plugin/idle_main.cc) includes only
plugin/runtime/ and topology/. Prints "file:line: ..." for each include
that points up or sideways and exits 1 if there is any.
"""
import os
import re
import sys

RANK = {
    "plugin": 0,
    "plugin/ops": 1,
    "plugin/alignment": 2,
    "plugin/guards": 2,
    "plugin/kubelet": 3,
    "plugin/runtime": 4,
    "topology": 5,
    "proto": 6,
}
# The folders that never see the kubelet's APIs, gRPC or protobuf.
NO_KUBELET = ("plugin/runtime", "topology")
# The idle binary and the only folders it includes.
IDLE_MAIN = "plugin/idle_main.cc"
IDLE = ("plugin/runtime", "topology")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
GRPC = re.compile(r"^(grpc|grpcpp|grpc\+\+|google/protobuf)/")


def folder_of_include(path):
    if path.startswith(("deviceplugin/", "podresources/")):
        return "proto"
    folder = os.path.dirname(path)
    return folder if folder in RANK else None


def check_file(root, relative):
    errors = []
    folder = os.path.dirname(relative)
    with open(os.path.join(root, relative), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            quote, path = match.groups()
            closing = '"' if quote == '"' else ">"
            where = f"{relative}:{number}: #include {quote}{path}{closing}"
            sees_kubelet = GRPC.match(path) or folder_of_include(path) == "proto"
            if folder in NO_KUBELET and sees_kubelet:
                errors.append(f"{where}: {folder}/ must not see gRPC, protobuf or the kubelet's APIs")
                continue
            if relative == IDLE_MAIN and sees_kubelet:
                errors.append(f"{where}: the idle binary must not see gRPC, protobuf or the kubelet's APIs")
                continue
            target = folder_of_include(path) if quote == '"' else None
            if target is None or target == folder:
                continue
            if relative == IDLE_MAIN and target not in IDLE:
                errors.append(f"{where}: the idle binary includes only plugin/runtime/ and topology/")
            elif RANK[target] <= RANK[folder]:
                errors.append(f"{where}: {folder}/ may include only the folders below it "
                              f"(ARCHITECTURE.md, \"Folders\"), not {target}/")
    return errors


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    errors = []
    checked = 0
    for folder in RANK:
        if folder == "proto":
            continue
        directory = os.path.join(root, folder)
        for name in sorted(os.listdir(directory)):
            if name.endswith((".h", ".cc")):
                errors += check_file(root, os.path.join(folder, name))
                checked += 1
    for error in errors:
        print(error)
    print(f"check-layering: {checked} files, {len(errors)} includes out of layer", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
