#!/usr/bin/env bash
# Builds airlock for long simulator soaks: the `soak` profile (release with
# fat LTO and one codegen unit) plus profile-guided optimization trained on
# the simulator's own scenarios. Prints the binary's absolute path.
#
#   sim/pgo-build.sh            (7 to 19 minutes on 2 cores)
#
# Needs the llvm-profdata of the LLVM that rustc was built with: `rustup
# component add llvm-tools` installs it in the toolchain's sysroot
# ($(rustc --print sysroot)/lib/rustlib/HOST/bin/llvm-profdata), where it is
# looked for first; then llvm-profdata-N and /usr/lib/llvm-N for rustc's LLVM
# N (`rustc -vV`), as a distribution packages it; or its path in
# LLVM_PROFDATA. The worlds are the same as any other build's: the
# simulator is deterministic, and only its speed depends on the build. It
# trains on seeds from 1,000,000 on, apart from the ones usually measured.
set -euo pipefail
cd "$(dirname "$0")/.."
host="$(rustc -vV | sed -n 's/^host: //p')"
llvm="$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')"
sysroot_profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ -n "${LLVM_PROFDATA:-}" ]; then
    profdata="$LLVM_PROFDATA"
elif [ -x "$sysroot_profdata" ]; then
    profdata="$sysroot_profdata"
else
    profdata="$(command -v "llvm-profdata-$llvm" || echo "/usr/lib/llvm-$llvm/bin/llvm-profdata")"
fi
if [ ! -x "$profdata" ]; then
    echo "pgo-build: needs llvm-profdata for LLVM $llvm: run \`rustup component add llvm-tools\`" \
        "(it installs $sysroot_profdata), or set LLVM_PROFDATA to one for LLVM $llvm" >&2
    exit 1
fi
target="${CARGO_TARGET_DIR:-target}/pgo"
work="$(mktemp -d "${TMPDIR:-/tmp}/airlock-pgo.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# With an explicit --target, RUSTFLAGS reach airlock's crates and not the
# build scripts and proc macros, whose runs would only add noise.
build() {
    RUSTFLAGS="$1" CARGO_TARGET_DIR="$target" \
        cargo build --locked --quiet --profile soak --target "$host" --bin airlock
}
build "-Cprofile-generate=$work/raw"
for scenario in default nested adversary pager broker; do
    "$target/$host/soak/airlock" sim --seed 1000000 --seeds 200 --jobs 2 --scenario "$scenario" >/dev/null
done
"$profdata" merge -o "$work/merged.profdata" "$work"/raw/*.profraw
build "-Cprofile-use=$work/merged.profdata"
realpath "$target/$host/soak/airlock"
