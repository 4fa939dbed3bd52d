#!/usr/bin/env bash
# Shows that `cargo nextest run --partition hash:K/N` shards the simulator's
# seed range (sim/tests/seeds.rs): the N shards' seed blocks are disjoint
# and together tile every scenario's whole range; and a seed planted to fail
# is reported, with its trace, by the one shard that owns it and no other.
#
#   sim/shards.sh [N]          (default 2 shards)
#
# AIRLOCK_SIM_SEEDS / AIRLOCK_SIM_BLOCK size the range (default 1000 seeds
# per scenario in blocks of 100); PLANT (default
# default:417:cleanup_forgets_last_handle) names the planted seed.
set -euo pipefail
cd "$(dirname "$0")/.."
shards="${1:-2}"
export AIRLOCK_SIM_SEEDS="${AIRLOCK_SIM_SEEDS:-1000}" AIRLOCK_SIM_BLOCK="${AIRLOCK_SIM_BLOCK:-100}"
export AIRLOCK_SIM_FIRST_SEED="${AIRLOCK_SIM_FIRST_SEED:-0}"
plant="${PLANT:-default:417:cleanup_forgets_last_handle}"
work="$(mktemp -d "${TMPDIR:-/tmp}/airlock-shards.XXXXXX")"
nextest=(cargo nextest)
sel=(--cargo-quiet --release -p airlock-sim --test seeds)

list() { "${nextest[@]}" list "${sel[@]}" --message-format oneline "$@" | awk '{print $2}' | sort; }

list >"$work/all"
for k in $(seq 1 "$shards"); do list --partition "hash:$k/$shards" >"$work/shard$k"; done

# Disjoint and complete: every block in exactly one shard.
sort "$work"/shard* >"$work/union"
if [ -n "$(uniq -d "$work/union")" ]; then echo "shards: a block is in two shards" >&2; exit 1; fi
if ! cmp -s "$work/union" "$work/all"; then echo "shards: the shards' union is not every block" >&2; exit 1; fi
# The blocks tile each scenario's range [first, first+seeds) without gap.
awk -F'::seeds_' -v first="$AIRLOCK_SIM_FIRST_SEED" -v n="$AIRLOCK_SIM_SEEDS" '
  { split($2, r, "_"); lo[$1] = lo[$1] " " r[1]+0 ":" r[2]+0 }
  END {
    for (s in lo) {
      m = split(lo[s], b, " "); covered = 0
      for (i = 1; i <= m; i++) { split(b[i], x, ":"); covered += x[2] - x[1] + 1; if (x[1] < first || x[2] >= first + n) bad = 1 }
      if (covered != n || bad) { print "shards: scenario " s " covers " covered " of " n " seeds"; exit 1 }
      print "shards: scenario " s ": " m " blocks, seeds " first ".." first + n - 1 " covered"
    }
  }' "$work/all"
for k in $(seq 1 "$shards"); do echo "shards: shard $k/$shards runs $(wc -l <"$work/shard$k") of $(wc -l <"$work/all") blocks"; done

# The planted seed: only the shard owning its block fails, with a trace.
scenario="${plant%%:*}"; rest="${plant#*:}"; seed="${rest%%:*}"
owner=""
for k in $(seq 1 "$shards"); do
    dir="$work/traces$k"
    # Only the planted scenario's blocks run, to keep this short; a filter
    # does not move a test between hash partitions.
    if AIRLOCK_SIM_PLANT="$plant" AIRLOCK_SIM_TRACE_DIR="$dir" "${nextest[@]}" run "${sel[@]}" \
        --partition "hash:$k/$shards" -E "test(/^${scenario}::/)" --no-fail-fast >"$work/run$k.log" 2>&1; then
        if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then echo "shards: shard $k passed but wrote traces" >&2; exit 1; fi
        echo "shards: shard $k/$shards passed, no trace"
    else
        traces=$(ls "$dir" 2>/dev/null || true)
        if ! grep -q "seed $seed \[$scenario\]" "$work/run$k.log" || [ -z "$traces" ]; then
            echo "shards: shard $k failed without reporting seed $seed and its trace; log $work/run$k.log" >&2; exit 1
        fi
        [ -z "$owner" ] || { echo "shards: seed $seed reported by shards $owner and $k" >&2; exit 1; }
        owner=$k
        echo "shards: shard $k/$shards reported seed $seed, trace $dir/$traces"
    fi
done
[ -n "$owner" ] || { echo "shards: no shard reported the planted seed $seed" >&2; exit 1; }
grep -q "^$scenario::seeds_.*" "$work/shard$owner"
echo "shards: ok ($work)"
