#!/usr/bin/env bash
# Fuzz every cargo-fuzz target for SECONDS seconds each (default 60), on
# stable (`-s none`), each from a scratch copy of its checked-in corpus, so
# the checked-in corpus is never modified. Targets come from
# `cargo fuzz list`: a target added to fuzz/Cargo.toml is fuzzed with no
# change here. Exits non-zero if any target crashed, after printing each
# crashing input's path and base64 and how it joins the corpus.
#
#   fuzz/run-all.sh [SECONDS]
#
# Needs cargo-fuzz (`.ci/run` installs it). FUZZ_WORK names the scratch
# directory (default: a new temporary one, kept so its artifacts survive).
set -euo pipefail
seconds="${1:-60}"
case "$seconds" in '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac
cd "$(dirname "$0")"

# The fuzz crate is its own workspace: keep its instrumented build out of
# the main target directory, whatever the caller exported.
export CARGO_TARGET_DIR="$PWD/target"
work="${FUZZ_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/airlock-fuzz.XXXXXX")}"
mkdir -p "$work"

cargo fuzz build -s none
mapfile -t targets < <(cargo fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz/run-all.sh: cargo fuzz list named no target" >&2
    exit 1
fi

failed=()
for target in "${targets[@]}"; do
    corpus="$work/corpus/$target"
    artifacts="$work/artifacts/$target"
    log="$work/$target.log"
    rm -rf "$corpus" "$artifacts"
    mkdir -p "$corpus" "$artifacts"
    if [ -d "corpus/$target" ]; then
        cp -R "corpus/$target/." "$corpus/"
    fi
    echo "fuzz: $target for ${seconds}s ($(find "$corpus" -type f | wc -l) seed inputs)"
    # -timeout: an input that runs this long is a hang, reported as a crash.
    if cargo fuzz run -s none "$target" "$corpus" -- \
        -max_total_time="$seconds" -timeout=20 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" >"$log" 2>&1; then
        grep -E '^stat::number_of_executed_units|^Done' "$log" | sed "s/^/fuzz: $target: /" || true
        continue
    fi
    failed+=("$target")
    echo "fuzz: $target FAILED; the end of its log ($log):"
    tail -n 40 "$log"
    found=0
    for input in "$artifacts"/*; do
        [ -f "$input" ] || continue
        found=1
        echo "fuzz: $target: crashing input $input ($(wc -c <"$input") bytes), base64:"
        base64 -w 76 "$input"
    done
    if [ "$found" -eq 1 ]; then
        cat <<EOF
fuzz: To reproduce: cd fuzz && cargo fuzz run -s none $target <input>
fuzz: Fix the bug at its root, then add the input to the corpus under a name
fuzz: that says what it exercises (see fuzz/README.md), e.g.
fuzz:   base64 -d > fuzz/corpus/$target/what_it_exercises   # paste the base64 above
fuzz: cargo test (core/tests/fuzz_corpus.rs) replays it from then on.
EOF
    else
        echo "fuzz: $target: no crashing input was written (build or setup failure?)"
    fi
done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (scratch dir $work)" >&2
    exit 1
fi
echo "fuzz: every target ran ${seconds}s without a crash: ${targets[*]}"
