#!/usr/bin/env bash
# Fuzzes one target for a bounded time: fuzz/run.sh TARGET SECONDS
# TARGET is key, canonical_json, config or resolution (fuzz/README.md).
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets stable take them.
# Findings land in fuzz/artifacts/TARGET/; the corpus in fuzz/corpus/TARGET/
# (neither is committed: minimise a finding with `cargo fuzz tmin` and keep
# it in fuzz/regressions/TARGET/, which `cargo test` runs on stable).
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run.sh TARGET SECONDS}
seconds=${2:-60}
export RUSTC_BOOTSTRAP=1

corpus=corpus/$target
if [ ! -d "$corpus" ]; then
  mkdir -p "$corpus"
  # A few seeds, so the first minutes are not spent finding the syntax.
  seed() { printf '%b' "$2" >"$corpus/seed-$1"; }
  case $target in
    key)
      seed bare 'task-42'
      seed quoted '"a\\"b\\\\c"' ;;
    canonical_json)
      seed object '{"b":[1.0,0.1,"\\u0041"],"a":null}\0{"a":null,"b":[1,1e-1,"A"]}\0/b/1'
      seed numbers '[9007199254740993, 1e400, -0]\0[9007199254740992,1e401,0]\0/0' ;;
    config)
      cp ../config/*.toml "$corpus/" ;;
    resolution)
      seed completed '{"outcome":"completed","operator":"ann","reference":"T-1","response":{"status":201,"headers":{"x-a":["1","2"],"content-type":"text/plain"},"body":"done"}}'
      seed json '{"outcome":"completed","operator":"ann","response":{"status":201.0,"body":{"id":7}}}'
      seed not_attempted '{"outcome":"not_attempted","operator":"ann","note":"checked"}' ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
fi

# Release build with debug assertions (so overflow panics); no sanitizer:
# idemgate forbids unsafe code and these targets reach no C code.
cargo fuzz run --debug-assertions --sanitizer none "$target" "$corpus" -- \
  -dict="dict/$target.dict" -max_total_time="$seconds" -print_final_stats=1
