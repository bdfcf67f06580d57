#!/usr/bin/env python3
"""Checks that every flag the chart passes to a Kudos binary (or to one of its subcommands, when
the first argument is a word: `kudos-orchestrator uninstall`), and every flag docs/operators.md
documents for it, is one that command's --help lists, and that the docs list every flag the
chart passes. Prints one line per command; exits 1 on any mismatch, 2 when no binary could run.

    check-flags.py RENDERED.yaml docs/operators.md BIN_DIR
"""
import os
import re
import subprocess
import sys

import yaml

BINARIES = ["kudos-orchestrator", "kudos-node-agent", "kudos-device-plugin"]
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def rendered_flags(path):
    """{command: flags}; a command is a binary, or "binary subcommand"."""
    flags = {b: set() for b in BINARIES}
    with open(path) as fh:
        for doc in yaml.safe_load_all(fh):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                name = c.get("image", "").rsplit("/", 1)[-1].split(":")[0]
                if name in BINARIES:
                    args = [str(a) for a in c.get("args", [])]
                    if args and not args[0].startswith("-"):
                        name = f"{name} {args.pop(0)}"
                    for a in args:
                        flags.setdefault(name, set()).update(FLAG.findall(a.split("=")[0]))
    return flags


def documented_flags(path):
    flags = {}
    with open(path) as fh:
        for line in fh:
            m = re.match(r"\| `(kudos-[a-z-]+(?: [a-z-]+)?)` \|(.*)\|\s*$", line)
            if m:
                flags.setdefault(m.group(1), set()).update(FLAG.findall(m.group(2)))
    return flags


def main():
    rendered, docs, bin_dir = sys.argv[1:4]
    passed, documented = rendered_flags(rendered), documented_flags(docs)
    failed, ran = 0, 0
    for b in sorted(set(passed) | {d for d in documented if d.split()[0] in BINARIES}):
        exe = os.path.join(bin_dir, b.split()[0])
        if not os.access(exe, os.X_OK):
            print(f"skip  {b}: not built in {bin_dir}")
            continue
        ran += 1
        out = subprocess.run([exe, *b.split()[1:], "--help"], capture_output=True, text=True, timeout=30)
        known = set(FLAG.findall(out.stdout))
        problems = []
        p, d = passed.get(b, set()), documented.get(b, set())
        if not p:
            problems.append("the chart passes it no flags (parsing broke?)")
        if unknown := sorted((p | d) - known):
            problems.append(f"not in --help: {' '.join(unknown)}")
        if undocumented := sorted(p - d):
            problems.append(f"passed by the chart but not in docs/operators.md: {' '.join(undocumented)}")
        if problems:
            failed += 1
            print(f"FAIL  {b}: " + "; ".join(problems))
        else:
            print(f"ok    {b}: {len(p)} flags passed, {len(d)} documented, all in --help")
    if ran == 0:
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
