#!/usr/bin/env python3
"""Checks that every relative link of the project's documentation resolves.

Usage: check_links.py REPO_ROOT

Reads README.md, CONTRIBUTING.md, ARCHITECTURE.md, BENCHMARKS.md,
CHANGELOG.md, the chart's README.md and docs/*.md. Every inline link [text](target) and reference definition
[name]: target outside code must name a file or directory that exists,
and a #anchor must be a heading of the target Markdown file (GitHub's
slugs: lower case, punctuation dropped, spaces to '-', repeats numbered).
Web links (scheme:) are not fetched. Prints one line per broken link,
"file:line: target: reason", and exits 1 if there is any.
"""
import os
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = None
    for number, line in enumerate(text.split("\n"), 1):
        match = FENCE.match(line)
        if match:
            if fenced is None:
                fenced = match.group(1)
            elif match.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found = set()
        counts = {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in prose_lines(text):
            for name in HTML_ANCHOR.findall(line):
                found.add(name)
            match = HEADING.match(line)
            if not match:
                continue
            base = slug(match.group(2))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def check(root, relative):
    errors = []
    source = os.path.join(root, relative)
    with open(source, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        stripped = CODE_SPAN.sub("", line)
        targets = INLINE.findall(stripped)
        match = REFERENCE.match(stripped)
        if match:
            targets.append(match.group(1))
        for target in targets:
            where = f"{relative}:{number}: {target}"
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # a web or mail link
            path_part, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(source), path_part)) \
                if path_part else source
            if not os.path.exists(path):
                errors.append(f"{where}: no such file or directory")
                continue
            if not os.path.realpath(path).startswith(os.path.realpath(root) + os.sep):
                errors.append(f"{where}: outside the repository")
                continue
            if anchor:
                if not path.endswith(".md") or os.path.isdir(path):
                    errors.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(path):
                    errors.append(f"{where}: no heading with anchor #{anchor} in "
                                  f"{os.path.relpath(path, root)}")
    return errors


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_links.py REPO_ROOT")
    root = os.path.abspath(sys.argv[1])
    files = ["README.md", "CONTRIBUTING.md", "ARCHITECTURE.md", "BENCHMARKS.md", "CHANGELOG.md",
             "helm/aws-efa-k8s-device-plugin/README.md"]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join("docs", n) for n in os.listdir(docs) if n.endswith(".md"))
    errors = []
    checked = 0
    for relative in files:
        if os.path.exists(os.path.join(root, relative)):
            errors += check(root, relative)
            checked += 1
    for error in errors:
        print(error)
    print(f"check_links: {checked} files, {len(errors)} broken links", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
