#!/usr/bin/env bash
# What each thing a first write does beyond the yardstick costs, measured:
# one release build of this tree with benches/cost-switches.patch applied,
# whose environment (IDEMGATE_COST_OFF=part,…) switches parts off, run by
# paired.sh against itself with nothing switched off. The patch is for
# measuring only and never lands: a part switched off breaks a promise
# (docs/performance.md, "What a first write's guarantees cost", says which).
#
#   benches/costs.sh                        # every part, then all together (~20 min)
#   PARTS="indexes json" benches/costs.sh   # some of them
#   ROUNDS=6 DURATION=8s benches/costs.sh   # paired.sh's settings (these are its defaults)
#
# Parts: `accesslog` (no access lines: RUST_LOG, no patch needed), `json`
# (the body hashed as sent, not canonicalised), `hmac` (scopes stored as
# their bare digest), `counts` (no kept counts), `cache` (no replay-cache
# insert), `indexes` (every index of `operations` but the primary key's and
# the identity's), `all` (those six at once) and `syncs` (machinery, not a
# guarantee: the log synced inside each commit on the writer and
# checkpointed there, as the yardstick does, instead of the deferred syncs
# of crates/wal-buffer, the sync threads and the checkpoint thread).
#
# The build is made in a temporary git worktree of HEAD (the patch must
# apply to it: one that no longer does fails here, loudly), with
# CARGO_TARGET_DIR or target/costs; everything else is paired.sh's.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
PARTS=${PARTS:-accesslog json hmac counts cache indexes all syncs}
for part in $PARTS; do
    case $part in accesslog | json | hmac | counts | cache | indexes | all | syncs) ;;
    *) echo "unknown part: $part" >&2; exit 2 ;; esac
done
target=${CARGO_TARGET_DIR:-$root/target/costs}
work=$(mktemp -d "${TMPDIR:-/tmp}/idemgate-costs.XXXXXX")
cleanup() {
    git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

git -C "$root" worktree add --quiet --detach "$work/tree" HEAD
git -C "$work/tree" apply "$here/cost-switches.patch"
CARGO_TARGET_DIR=$target cargo build --quiet --release --locked --manifest-path "$work/tree/Cargo.toml"
binary=$work/idemgate
cp "$target/release/idemgate" "$binary"

# A wrapper that runs the build with `part` switched off ($2 the
# environment it sets), so paired.sh can take it as a binary.
wrapper() {
    printf '#!/bin/sh\n%s exec %q "$@"\n' "$2" "$binary" >"$work/$1"
    chmod +x "$work/$1"
}
wrapper none ""
results=()
for part in $PARTS; do
    case $part in
    accesslog) wrapper "$part" "RUST_LOG=info,idemgate::access=off" ;;
    all) wrapper "$part" "RUST_LOG=info,idemgate::access=off IDEMGATE_COST_OFF=json,hmac,counts,cache,indexes" ;;
    *) wrapper "$part" "IDEMGATE_COST_OFF=$part" ;;
    esac
    echo "== without $part"
    "$here/paired.sh" "$work/none" "$work/$part" | tee "$work/$part.out"
    results+=("$(printf '%-10s %s' "$part" "$(sed -n 's/^.*median of .* rounds: //p' "$work/$part.out")")")
done
echo
echo "first writes without the part / with it (median of paired.sh's rounds):"
printf '  %s\n' "${results[@]}"
