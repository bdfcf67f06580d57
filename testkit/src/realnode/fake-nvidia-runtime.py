#!/usr/bin/python3
# A stand-in for nvidia-container-runtime (the NVIDIA container toolkit's legacy mode) on a node
# with fake GPUs: on `create`, a container whose environment sets NVIDIA_VISIBLE_DEVICES (to
# anything but "void" or "none") gets the node's driver library bind-mounted read-only at the
# path the toolkit uses, then runc runs as usual. Device nodes are not injected: the fake driver
# has none. The harness writes this file per node with the placeholders filled in.
import json
import os
import sys

RUNC = "@RUNC@"
DRIVER_DIR = "@DRIVER_DIR@"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# The fake libnvidia-ml.so.1 reads fake-nvml.conf beside itself, as a real driver reads its
# own state from the kernel module.
FILES = ["libnvidia-ml.so.1", "fake-nvml.conf"]


def inject(bundle):
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    env = spec.get("process", {}).get("env", [])
    visible = None
    for kv in env:
        if kv.startswith("NVIDIA_VISIBLE_DEVICES="):
            visible = kv.split("=", 1)[1]
    if visible in (None, "", "void", "none"):
        return
    mounts = spec.setdefault("mounts", [])
    for name in FILES:
        mounts.append({
            "destination": os.path.join(LIB_DIR, name),
            "type": "bind",
            "source": os.path.join(DRIVER_DIR, name),
            "options": ["rbind", "ro", "nosuid", "nodev"],
        })
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(spec, f)
    os.rename(tmp, path)


def main():
    args = sys.argv[1:]
    if "create" in args:
        bundle = "."
        for i, a in enumerate(args):
            if a in ("--bundle", "-b") and i + 1 < len(args):
                bundle = args[i + 1]
            elif a.startswith("--bundle="):
                bundle = a.split("=", 1)[1]
        inject(bundle)
    os.execv(RUNC, [RUNC] + args)


main()
