#!/usr/bin/env bash
# The declared MSRV is true of the locked dependencies: every package that a
# published crate (acemq-codec, acemq-memory, acemq-core, with all their
# features, and acemq-cli) builds with, as Cargo.lock pins it, accepts that crate's
# `rust-version`.
#
#   scripts/msrv.sh      # exit 0: every dependency accepts it; 1: each offender printed
#
# No other toolchain is needed: it reads each package's `rust_version` from
# `cargo metadata`. Normal and build dependencies count (proc macros and
# build scripts are compiled by the same toolchain); dev-dependencies do
# not. Dependencies for every platform count, not only this machine's. It
# does not check the crates' own code: clippy's `incompatible_msrv` lint
# does that for the standard library's APIs, against the same number.
set -euo pipefail
cd "$(dirname "$0")/.."

check=$(
    cat <<'PY'
import json, sys

CRATES = ("acemq-codec", "acemq-memory", "acemq-core", "acemq-cli")
meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}


def version(text):
    """`1.89` and `1.89.0` alike, as (1, 89, 0)."""
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


failed = False
for name in CRATES:
    [root] = [p for p in meta["packages"] if p["name"] == name and p["source"] is None]
    declared = root.get("rust_version")
    if not declared:
        print(f"{name}: no rust-version declared", file=sys.stderr)
        failed = True
        continue
    # Every package reached through normal and build edges, with the one
    # that brought it in first. The workspace's own crates among them are
    # checked as crates of their own.
    parent, stack = {root["id"]: None}, [root["id"]]
    while stack:
        at = stack.pop()
        for dep in nodes[at]["deps"]:
            wanted = any(kind["kind"] in (None, "build") for kind in dep["dep_kinds"])
            if wanted and dep["pkg"] not in parent:
                parent[dep["pkg"]] = at
                stack.append(dep["pkg"])
    needing = sorted(
        ((version(packages[p]["rust_version"]), p) for p in parent if packages[p]["source"] and packages[p].get("rust_version")),
        reverse=True,
    )
    above = [(needs, p) for needs, p in needing if needs > version(declared)]
    for needs, pkg_id in above[:10]:
        chain, at = [], pkg_id
        while at is not None:
            chain.append(packages[at]["name"])
            at = parent[at]
        print(
            f"{name} declares rust-version {declared}, but {packages[pkg_id]['name']} "
            f"{packages[pkg_id]['version']} needs {packages[pkg_id]['rust_version']} ({' <- '.join(chain)})",
            file=sys.stderr,
        )
    if len(above) > 10:
        print(f"{name}: and {len(above) - 10} more", file=sys.stderr)
    failed = failed or bool(above)
    if needing:
        top = packages[needing[0][1]]
        print(f"{name}: rust-version {declared}; its dependencies need at most {top['rust_version']} ({top['name']} {top['version']})")
sys.exit(1 if failed else 0)
PY
)
cargo metadata --format-version 1 --all-features --locked | python3 -c "$check"
