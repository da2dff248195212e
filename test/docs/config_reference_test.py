#!/usr/bin/env python3
"""Checks docs/configuration.md against the daemon's own list of options.

Usage: config_reference_test.py DAEMON_BINARY CONFIGURATION_MD

The daemon's --help is generated from Options() in plugin/config.cc: one
entry per option, "--flag TYPE  help [env: VAR, key: key, default: value]".
The reference's table has a row per option, "| `key` | `--flag` | `VAR` |
`default` | meaning |". Every option must have its row, with the same flag,
variable and default, and every row must be an option. Prints one line per
difference, naming the option, and exits 1 if there is any.
"""
import re
import subprocess
import sys

ENTRY = re.compile(r"^--([a-z0-9-]+)\b.*\[env: (EFA_[A-Z0-9_]+), key: (\w+), default: (.*)\]$")
ROW = re.compile(r"^\|\s*`(\w+)`\s*\|\s*`--([a-z0-9-]+)`\s*\|\s*`(EFA_[A-Z0-9_]+)`\s*\|\s*`(.*?)`\s*\|")


def normalize(default):
    # The help quotes strings ("/sys", ["dra.net"]); the table does not,
    # except the empty string ("").
    return re.sub(r'"([^"]+)"', r"\1", default)


def options_from_help(binary):
    text = subprocess.run([binary, "--help"], check=True, capture_output=True,
                          text=True).stdout
    entries = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("--"):
            entries.append(stripped)
        elif entries and line.startswith(" " * 8) and stripped:
            entries[-1] += " " + stripped  # CLI11 wraps a long flag's help
        elif not stripped:
            entries.append("")
    options = {}
    for entry in entries:
        match = ENTRY.match(entry)
        if match:
            flag, env, key, default = match.groups()
            options[key] = (flag, env, normalize(default))
    return options


def options_from_doc(path):
    options = {}
    duplicates = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            match = ROW.match(line)
            if match:
                key, flag, env, default = match.groups()
                if key in options:
                    duplicates.append(f"{path}:{number}: {key}: documented twice")
                options[key] = (flag, env, default)
    return options, duplicates


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: config_reference_test.py DAEMON_BINARY CONFIGURATION_MD")
    binary, doc = sys.argv[1], sys.argv[2]
    code = options_from_help(binary)
    if len(code) < 10:
        sys.exit(f"{binary} --help: found only {len(code)} options; has its format changed?")
    documented, errors = options_from_doc(doc)
    for key in sorted(code.keys() - documented.keys()):
        errors.append(f"{doc}: {key}: an option of the daemon, missing from the table")
    for key in sorted(documented.keys() - code.keys()):
        errors.append(f"{doc}: {key}: documented, but the daemon has no such option")
    names = ("flag", "variable", "default")
    for key in sorted(code.keys() & documented.keys()):
        for name, want, got in zip(names, code[key], documented[key]):
            if want != got:
                errors.append(f"{doc}: {key}: {name} is \"{got}\" in the table, "
                              f"\"{want}\" in the daemon")
    for error in errors:
        print(error)
    print(f"config_reference_test: {len(code)} options, {len(errors)} differences",
          file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
