#!/usr/bin/env python3
"""Checks that every flag the chart passes to a Kudos binary, and every flag docs/operators.md
documents for it, is one the binary's --help lists, and that the docs list every flag the chart
passes. Prints one line per binary; exits 1 on any mismatch, 2 when no binary could be run.

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
    flags = {b: set() for b in BINARIES}
    with open(path) as fh:
        for doc in yaml.safe_load_all(fh):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                name = c.get("image", "").rsplit("/", 1)[-1].split(":")[0]
                if name in flags:
                    for a in c.get("args", []):
                        flags[name].update(FLAG.findall(str(a).split("=")[0]))
    return flags


def documented_flags(path):
    flags = {b: set() for b in BINARIES}
    with open(path) as fh:
        for line in fh:
            m = re.match(r"\| `(kudos-[a-z-]+)` \|(.*)\|\s*$", line)
            if m and m.group(1) in flags:
                flags[m.group(1)].update(FLAG.findall(m.group(2)))
    return flags


def main():
    rendered, docs, bin_dir = sys.argv[1:4]
    passed, documented = rendered_flags(rendered), documented_flags(docs)
    failed, ran = 0, 0
    for b in BINARIES:
        exe = os.path.join(bin_dir, b)
        if not os.access(exe, os.X_OK):
            print(f"skip  {b}: not built in {bin_dir}")
            continue
        ran += 1
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
        known = set(FLAG.findall(out.stdout))
        problems = []
        if not passed[b]:
            problems.append("the chart passes it no flags (parsing broke?)")
        if unknown := sorted((passed[b] | documented[b]) - known):
            problems.append(f"not in --help: {' '.join(unknown)}")
        if undocumented := sorted(passed[b] - documented[b]):
            problems.append(f"passed by the chart but not in docs/operators.md: {' '.join(undocumented)}")
        if problems:
            failed += 1
            print(f"FAIL  {b}: " + "; ".join(problems))
        else:
            print(f"ok    {b}: {len(passed[b])} flags passed, {len(documented[b])} documented, all in --help")
    if ran == 0:
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
