#!/usr/bin/env bash
# How cost grows with size: four series, each written as CSV and plotted as
# SVG into docs/perf/ (see docs/perf.md, "Scale"):
#
#   sim-steps     seeds/s of `airlock sim --scenario default` against the
#                 steps per seed (`--steps K`, the seed's own clients)
#   sim-clients   the same against clients per world (`--clients N`, the
#                 seed's own steps)
#   proxy-clients airlock CPU per 4 KiB frame with N concurrent clients
#                 (`benches/proxy.rs` with PROXY_BENCH_CLIENTS)
#   broker-waiters one broker step with N calls waiting (`benches/broker.rs`,
#                 criterion's medians)
#
#   benches/scale.sh            all of them (a few minutes on two cores)
#   benches/scale.sh sim proxy  only those (sim, proxy, broker)
#   benches/scale.sh plot       redraw the SVGs from the CSVs, measuring nothing
#
# Sizes, by environment variable (defaults in brackets):
#   SIM_SEEDS      seeds per sim point [200]; a `--steps K` point below
#                  2000 runs 2000/K times as many, so every point runs long
#                  enough to time
#   SIM_JOBS       sim worker threads [2]
#   SIM_STEPS      --steps values [125 250 500 1000 2000 4000]; each point's
#                  x is the mean steps per seed measured, as a world drains
#                  after K and some end before it
#   SIM_CLIENTS    --clients values [1 2 4 8 16 32 64]
#   PROXY_MIB      MiB read in all per proxy point, shared by the clients [32]
#   PROXY_CLIENTS  client counts [1,2,4,8,16,32,64]
#   PROXY_RUNS     runs per proxy point, the best by CPU kept [5]
# The broker's waiter counts are the bench's own (10 to 100 000).
#
# Machine load (`uptime`) is recorded before and after each series in
# docs/perf/scale-load.txt: on a shared machine absolute figures move with
# it, the shape of each series is what to read.
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=docs/perf
mkdir -p "$OUT"
SIM_SEEDS=${SIM_SEEDS:-200}
SIM_JOBS=${SIM_JOBS:-2}
SIM_STEPS=${SIM_STEPS:-125 250 500 1000 2000 4000}
SIM_CLIENTS=${SIM_CLIENTS:-1 2 4 8 16 32 64}
PROXY_MIB=${PROXY_MIB:-32}
PROXY_CLIENTS=${PROXY_CLIENTS:-1,2,4,8,16,32,64}
PROXY_RUNS=${PROXY_RUNS:-5}
PLOT="python3 benches/plot_svg.py"
LOAD="$OUT/scale-load.txt"

series=("$@")
[ ${#series[@]} -gt 0 ] || series=(sim proxy broker)
want() { [[ " ${series[*]} " == *" $1 "* ]]; }

load() { echo "$1: $(uptime)" >> "$LOAD"; }
want plot || : > "$LOAD"

# Failing seeds' traces would go under traces/failures by default; a run
# that only measures writes nowhere in the repository.
TRACES=$(mktemp -d)
trap 'rm -rf "$TRACES"' EXIT

# One `airlock sim` run of SEEDS seeds; prints "seeds,steps,wall_s,cpu_s":
# the steps from its summary line ("N seeds (default scenario) in X.XXs:
# ... S steps, ..."), its wall and CPU (user + system) times from bash's
# `time`, to the millisecond. CPU time is the steadier of the two on a
# loaded machine: waiting for a core is not in it.
TIMEFORMAT='%3R %3U %3S'
sim_point() {
    local seeds=$1 out times
    shift
    out=$(mktemp)
    times=$( { time target/release/airlock sim --seeds "$seeds" --jobs "$SIM_JOBS" --scenario default \
        --trace-dir "$TRACES" "$@" > "$out"; } 2>&1 )
    grep ' seeds (default scenario) in ' "$out" | sed -E 's/^([0-9]+) seeds .*, ([0-9]+) steps[ ,].*/\1,\2/' | tr -d '\n'
    rm -f "$out"
    awk '{ printf ",%s,%.3f\n", $1, $2 + $3 }' <<< "$times"
}

# seeds,steps,wall_s,cpu_s -> the derived columns.
derive() {
    awk -F, '{ printf "%.1f,%.1f,%.0f,%.3f,%.3f,%.1f", $2 / $1, $1 / $3, $2 / $3, $3 * 1e6 / $2, $4 * 1e6 / $2, $1 / $4 }' <<< "$1"
}

# The plots, from the CSVs as they are (`benches/scale.sh plot` redraws
# them all without measuring anything).
plot_sim() {
    $PLOT "$OUT/sim-steps.csv" "$OUT/sim-steps.svg" --x steps_per_seed --y seeds_per_s,seeds_per_cpu_s \
        --title "airlock sim, default scenario: seeds/s against steps per seed" \
        --xlabel "mean steps per seed (--steps 125 … 4000)" --ylabel "seeds per second (wall, CPU)" --logx --logy
    $PLOT "$OUT/sim-steps.csv" "$OUT/sim-steps-cost.svg" --x steps_per_seed --y us_per_step,cpu_us_per_step \
        --title "airlock sim, default scenario: time per step" \
        --xlabel "mean steps per seed" --ylabel "µs per step (wall, CPU)" --logx
    $PLOT "$OUT/sim-clients.csv" "$OUT/sim-clients.svg" --x clients --y seeds_per_s,seeds_per_cpu_s \
        --title "airlock sim, default scenario: seeds/s against clients per world" \
        --xlabel "clients per world (--clients)" --ylabel "seeds per second (wall, CPU)" --logx --logy
    $PLOT "$OUT/sim-clients.csv" "$OUT/sim-clients-cost.svg" --x clients --y us_per_step,cpu_us_per_step \
        --title "airlock sim, default scenario: time per step" \
        --xlabel "clients per world (--clients)" --ylabel "µs per step (wall, CPU)" --logx
}
plot_proxy() {
    $PLOT "$OUT/proxy-clients.csv" "$OUT/proxy-clients.svg" --x clients --y cpu_us_per_frame \
        --title "airlock serve: CPU per 4 KiB frame against concurrent clients" \
        --xlabel "concurrent clients" --ylabel "airlock CPU µs per frame" --logx
}
plot_broker() {
    $PLOT "$OUT/broker-waiters.csv" "$OUT/broker-waiters.svg" --x waiters --y enqueue_dispatch_us,cancel_waiter_us \
        --title "LLM broker: one step against calls waiting (criterion median)" \
        --xlabel "waiters" --ylabel "µs per step" --logx
}
if want plot; then
    plot_sim
    plot_proxy
    plot_broker
    exit 0
fi

# One build for every series: the benches' build also writes the
# `target/release/airlock` the sim series runs (a separate `cargo build
# --release` would compile everything again with other features, those of
# the dev-dependencies left out).
cargo bench --no-run --bench proxy --bench broker

if want sim; then
    COLS=seeds,steps,wall_s,cpu_s,steps_per_seed,seeds_per_s,steps_per_s,us_per_step,cpu_us_per_step,seeds_per_cpu_s
    load "sim, before"
    csv="$OUT/sim-steps.csv"
    echo "steps_arg,$COLS" > "$csv"
    for k in $SIM_STEPS; do
        r=$(sim_point $(( SIM_SEEDS * (k < 2000 ? 2000 / k : 1) )) --steps "$k")
        echo "$k,$r,$(derive "$r")" | tee -a "$csv"
    done
    csv="$OUT/sim-clients.csv"
    echo "clients,$COLS" > "$csv"
    for n in $SIM_CLIENTS; do
        r=$(sim_point "$SIM_SEEDS" --clients "$n")
        echo "$n,$r,$(derive "$r")" | tee -a "$csv"
    done
    load "sim, after"
    plot_sim
fi

if want proxy; then
    load "proxy, before"
    PROXY_BENCH_CLIENTS="$PROXY_CLIENTS" PROXY_BENCH_CSV="$PWD/$OUT/proxy-clients.csv" \
        PROXY_BENCH_MIB="$PROXY_MIB" PROXY_BENCH_RUNS="$PROXY_RUNS" cargo bench --bench proxy
    load "proxy, after"
    plot_proxy
fi

if want broker; then
    load "broker, before"
    cargo bench --bench broker
    load "broker, after"
    csv="$OUT/broker-waiters.csv"
    echo "waiters,enqueue_dispatch_us,cancel_waiter_us" > "$csv"
    # Criterion's median of each point, in ns, from its estimates.
    median() {
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"] / 1000)' \
            "target/criterion/$1/$2/new/estimates.json"
    }
    for n in 10 1000 10000 100000; do
        echo "$n,$(median broker_enqueue_dispatch "$n"),$(median broker_cancel_waiter "$n")" | tee -a "$csv"
    done
    plot_broker
fi
