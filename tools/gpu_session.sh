#!/usr/bin/env bash
# One GPU-machine session, from the repository root: the GPU test suite, the CLI on the tiny demo,
# then the full-size synthetic 27B artifact (synthesized there: it is 17.5 GB).
#
#   tools/gpu_session.sh OUT_DIR [--skip-tests] [--skip-27b] [--bench-args "..."]
#
# Needs prebuilt cubins in .gpu/kernels (`inferno kernels build --arch sm_90a --out .gpu/kernels`,
# name .gpu/kernels in the device tool's carry). Logs and JSON go to OUT_DIR; a short table last.
set -uo pipefail
out=${1:?usage: tools/gpu_session.sh OUT_DIR [--skip-tests] [--skip-27b] [--bench-args ARGS]}; shift
tests=1; big=1; bench_args="--prompt-tokens 512 --decode-tokens 128 --reps 3"
while [[ $# -gt 0 ]]; do
    case $1 in
        --skip-tests) tests=0; shift ;;
        --skip-27b) big=0; shift ;;
        --bench-args) bench_args=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 INFERNO_KERNEL_DIR=$PWD/.gpu/kernels INFERNO_CACHE=/tmp/inferno-cache
py=${PYTHON:-python3}
declare -a rows

step() {  # step NAME LOG command...
    local name=$1 log=$2; shift 2
    local t0=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    rows+=("$(printf '%-28s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -1 "$log" | cut -c1-110)")")
    return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >"$out/smi.txt" 2>&1
if [[ $tests == 1 ]]; then
    step "gpu tests" "$out/tests.out" tools/gpu_tests.sh "$out" --kernels .gpu/kernels
fi
step "run demo (cuda)" "$out/run_demo.log" timeout 120 $py -m inferno run --device cuda --no-thinking --max-new 48 --greedy
step "bench demo (cuda)" "$out/bench_demo.log" timeout 180 $py -m inferno bench --device cuda --prompt-tokens 256 \
    --decode-tokens 128 --reps 3 --json "$out/bench_demo.json"
if [[ $big == 1 ]]; then
    step "synth 27B artifact" "$out/synth27.log" timeout 240 $py -m inferno synth qwen3.6-27b /tmp/q27.ninfer
    step "run 27B (cuda)" "$out/run27.log" timeout 200 $py -m inferno run /tmp/q27.ninfer --device cuda --no-thinking \
        --max-new 64 --greedy --prompt "Tell me about fire."
    # shellcheck disable=SC2086
    step "bench 27B (cuda)" "$out/bench27.log" timeout 240 $py -m inferno bench /tmp/q27.ninfer --device cuda $bench_args \
        --json "$out/bench27.json"
fi
echo
printf '%s\n' "${rows[@]}"
