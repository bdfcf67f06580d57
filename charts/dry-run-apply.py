#!/usr/bin/env python3
"""Applies every object of multi-document YAML files to a kube-apiserver with server-side apply
and dryRun=All (nothing is stored) and strict field validation (an unknown or misspelt field is an
error, not silently dropped). Prints one line per object; exits 1 if any object was refused.

    dry-run-apply.py --server https://127.0.0.1:6443 --token T --ca ca.crt [--for-real] FILE...

--for-real stores the objects (still strict), for tests that then run components under them.

Namespaces named in the files are created for real first (a dry-run object in a namespace that
does not exist is refused by admission, which would hide every other check).
"""
import argparse
import json
import ssl
import sys
import urllib.error
import urllib.request

import yaml


def request(args, ctx, method, path, body=None, content_type="application/json"):
    req = urllib.request.Request(args.server + path, method=method, data=body)
    req.add_header("Authorization", "Bearer " + args.token)
    req.add_header("Accept", "application/json")
    if body is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"message": text}


def discover(args, ctx, api_version, cache):
    """kind -> (plural, namespaced) for one group/version, from the server's discovery."""
    if api_version not in cache:
        path = "/api/v1" if api_version == "v1" else "/apis/" + api_version
        status, body = request(args, ctx, "GET", path)
        cache[api_version] = {}
        if status == 200:
            for r in body.get("resources", []):
                if "/" not in r["name"]:
                    cache[api_version][r["kind"]] = (r["name"], r["namespaced"])
    return cache[api_version]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--for-real", action="store_true", help="store the objects (no dryRun)")
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    ctx = ssl.create_default_context(cafile=args.ca)

    docs = []
    for f in args.files:
        with open(f) as fh:
            docs += [d for d in yaml.safe_load_all(fh) if d]
    if not docs:
        print("dry-run-apply: no objects in " + " ".join(args.files), file=sys.stderr)
        return 1

    for ns in sorted({d["metadata"].get("namespace") for d in docs} - {None, "default", "kube-system"}):
        body = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        status, out = request(args, ctx, "POST", "/api/v1/namespaces", body.encode())
        if status not in (201, 409):
            print(f"dry-run-apply: creating namespace {ns}: {out.get('message')}", file=sys.stderr)
            return 1

    cache, failed = {}, 0
    for d in docs:
        kind, api_version, meta = d.get("kind"), d.get("apiVersion"), d.get("metadata", {})
        what = f"{kind} {meta.get('namespace', '')}/{meta.get('name')}".replace(" /", " ")
        resource = discover(args, ctx, api_version, cache).get(kind)
        if resource is None:
            print(f"REFUSED {what}: {api_version} {kind} is not served by this API server")
            failed += 1
            continue
        plural, namespaced = resource
        base = "/api/v1" if api_version == "v1" else "/apis/" + api_version
        if namespaced:
            base += "/namespaces/" + meta.get("namespace", "default")
        path = (f"{base}/{plural}/{meta['name']}"
                "?fieldManager=kudos-chart-test&force=true&fieldValidation=Strict"
                + ("" if args.for_real else "&dryRun=All"))
        status, out = request(args, ctx, "PATCH", path, json.dumps(d).encode(),
                              "application/apply-patch+yaml")
        if status in (200, 201):
            print(f"ok      {what}")
        else:
            print(f"REFUSED {what}: HTTP {status}: {out.get('message')}")
            failed += 1
    print(f"dry-run-apply: {len(docs) - failed} of {len(docs)} objects accepted")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
