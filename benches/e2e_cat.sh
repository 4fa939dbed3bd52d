#!/usr/bin/env bash
# End-to-end cost of reading a file through the proxy: `airlock run` +
# `airlock fs cat` against plain `cat` of the same file, in the same run.
# Usage: benches/e2e_cat.sh [MIB] [RUNS]   (defaults: 64 MiB, best of 5)
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-64}
runs=${2:-5}
cargo build --release -q
bin=$PWD/target/release/airlock
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c $((mib << 20)) /dev/urandom > "$dir/data"

best() { # best wall time in seconds of RUNS runs of "$@"
    python3 - "$runs" "$@" <<'PY'
import subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
best = float("inf")
for _ in range(runs):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    best = min(best, time.perf_counter() - t)
print(f"{best:.4f}")
PY
}

cat_s=$(best cat "$dir/data")
proxy_s=$(best "$bin" run --allow "$dir" -- "$bin" fs cat "$dir/data")
# The bytes that came out must be the file's.
cmp <("$bin" run --allow "$dir" -- "$bin" fs cat "$dir/data") "$dir/data"
python3 - "$mib" "$cat_s" "$proxy_s" <<'PY'
import sys
mib, c, p = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"{mib} MiB: cat {c*1000:.1f} ms ({mib/c:.0f} MiB/s); airlock run + fs cat {p*1000:.1f} ms ({mib/p:.0f} MiB/s); ratio {p/c:.1f}x")
PY
