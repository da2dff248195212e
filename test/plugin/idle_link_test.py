#!/usr/bin/env python3
"""The idle binary links no gRPC or protobuf, by construction.

Usage: idle_link_test.py BUILD_DIR BINARY

efa-k8s-device-plugin-idle (plugin/idle_main.cc) is what a node without EFA
runs; it is built from plugin/runtime/ and topology/, which link neither
gRPC nor protobuf. Fails, naming each, when
- its link command (build.ninja's LINK_LIBRARIES, or link.txt of the
  Makefile generators) names a library of gRPC, protobuf or what only they
  bring (c-ares, re2, upb, address_sorting), the generated kubelet APIs
  (efa_proto) or a plugin/ library above plugin/runtime/: the link line
  itself must be free of them, not only the result after --as-needed or a
  static archive's unused members;
- its dynamic section (readelf -d) has a NEEDED entry of such a library
  (what the shared-library builds, -DEFA_STATIC_GRPC=OFF, would show).
"""
import os
import re
import shlex
import subprocess
import sys

TARGET = "efa-k8s-device-plugin-idle"
# A library file or target of gRPC, protobuf, what only they bring, or a
# project library that links them.
FORBIDDEN = re.compile(
    r"(^|/|-l)(lib)?(grpc[^/]*|gpr|upb|address_sorting|protobuf[^/]*|protoc|cares|re2|"
    r"efa_(proto|kubelet|alignment|guards|ops|plugin))(\.(a|so)[.0-9]*)?$")


def link_command(build_dir):
    """The idle binary's link libraries as tokens, and where they were read."""
    txt = os.path.join(build_dir, "plugin", "CMakeFiles", f"{TARGET}.dir", "link.txt")
    if os.path.exists(txt):
        with open(txt, encoding="utf-8") as f:
            return shlex.split(f.read()), txt
    ninja = os.path.join(build_dir, "build.ninja")
    with open(ninja, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("build ") and re.match(rf"build \S*/{re.escape(TARGET)}:", line):
            for attribute in lines[i + 1:]:
                if not attribute.startswith("  "):
                    break
                name, _, value = attribute.strip().partition(" = ")
                if name == "LINK_LIBRARIES":
                    return shlex.split(value), ninja
            return [], ninja
    sys.exit(f"{ninja}: no link step of {TARGET}")


def needed(binary):
    out = subprocess.run(["readelf", "-d", binary], check=True, capture_output=True, text=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build_dir, binary = sys.argv[1], sys.argv[2]
    tokens, source = link_command(build_dir)
    libraries = [t for t in re.split(r"[\s,]+", " ".join(tokens)) if t]
    entries = needed(binary)
    errors = [f"{source}: {TARGET} links {t}" for t in libraries if FORBIDDEN.search(t)]
    errors += [f"{binary}: NEEDED {e}" for e in entries if FORBIDDEN.search(e.split(".so")[0])]
    for error in errors:
        print(error)
    print(f"idle_link_test: {len(libraries)} link arguments, NEEDED: {', '.join(entries)}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
