#!/usr/bin/env bash
# Fuzz every target (or the ones named) for N minutes each, then minimise its corpus.
# Usage: ./scripts/fuzz.sh [minutes] [target...]      (default: 5 minutes, every target)
#
# cargo-fuzz drives libFuzzer, which needs nightly-only flags: RUSTC_BOOTSTRAP=1 lets the
# stable toolchain take them. Sanitizer none: the targets are safe Rust, so what is hunted
# is panics and overflows (debug assertions stay on); AddressSanitizer would double the
# build and halve the rate. New inputs go to fuzz/corpus/<target>/ (commit them after
# the run; `cargo test` replays them), crashes to fuzz/artifacts/<target>/.
# The run itself is never part of the suite: scripts/test.sh only replays.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

minutes="${1:-5}"
shift || true
if ! [[ "$minutes" =~ ^[0-9]+$ ]] || [ "$minutes" -lt 1 ]; then
    echo "usage: $0 [minutes >= 1] [target...]" >&2
    exit 2
fi

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --version 0.13.2 --locked
fi
export RUSTC_BOOTSTRAP=1
fuzz=(cargo fuzz)
options=(--sanitizer none)

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <("${fuzz[@]}" list)
fi

echo "== building ${targets[*]}"
"${fuzz[@]}" build "${options[@]}"

crashed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    echo "== $target: ${minutes} min"
    # corpus/ first: libFuzzer writes what it finds there; seeds/ is read only.
    if ! "${fuzz[@]}" run "${options[@]}" "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time=$((minutes * 60)) -timeout=10 -print_final_stats=1; then
        crashed+=("$target")
    fi
    # A set cover keeps fewer files than a plain merge for the same features.
    echo "== $target: minimising the corpus"
    "${fuzz[@]}" cmin "${options[@]}" "$target" "corpus/$target" -- -set_cover_merge=1
done

if [ "${#crashed[@]}" -gt 0 ]; then
    echo "crashed: ${crashed[*]} (inputs in fuzz/artifacts/; reproduce with cargo test --lib fuzzing after copying one to fuzz/seeds/<target>/)" >&2
    exit 1
fi
echo "no crash in ${targets[*]}"
