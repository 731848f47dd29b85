#!/usr/bin/env bash
# Run the GPU test suite on a machine with an NVIDIA GPU, from the repository root.
#
#   tools/gpu_tests.sh OUT_DIR [--kernels DIR] [extra pytest args or test paths...]
#
# OUT_DIR       where the log (gpu_tests.log) and JUnit XML (gpu_tests.xml) go; created if missing.
# --kernels DIR prebuilt cubins + manifests (`inferno kernels build --out DIR`); default .gpu/kernels
#               when it exists. Exported as INFERNO_KERNEL_DIR.
# Wheels in .whl/ (see /work/.library/device/README.md) are installed to /tmp/site first.
# The package is not installed there: it runs from the tree (PYTHONPATH=.).
# Prints a short summary last; exits with pytest's status.
set -uo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: tools/gpu_tests.sh OUT_DIR [--kernels DIR] [pytest args...]" >&2
    exit 2
fi
out=$1; shift
kernels=""
if [[ "${1:-}" == "--kernels" ]]; then
    kernels=${2:?"--kernels needs a directory"}; shift 2
elif [[ -d .gpu/kernels ]]; then
    kernels=.gpu/kernels
fi
if [[ ! -f pyproject.toml || ! -d inferno ]]; then
    echo "tools/gpu_tests.sh: run it from the repository root" >&2
    exit 2
fi
mkdir -p "$out"
log=$out/gpu_tests.log
py=${PYTHON:-python3}

site=""
if compgen -G ".whl/*.whl" >/dev/null; then
    site=/tmp/site
    if ! $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        >"$out/pip.log" 2>&1; then
        echo "tools/gpu_tests.sh: installing .whl/*.whl failed; see $out/pip.log" | tee -a "$log" >&2
        exit 2
    fi
fi
export PYTHONPATH=".${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
[[ -n "$kernels" ]] && export INFERNO_KERNEL_DIR=$(cd "$kernels" && pwd)

{
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) tools/gpu_tests.sh"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
    $py - <<'PY'
import sys
print("python", sys.version.split()[0])
for mod in ("cuda.bindings", "numpy", "ml_dtypes", "pytest"):
    try:
        m = __import__(mod, fromlist=["__version__"])
        print(f"{mod} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{mod} MISSING ({type(e).__name__})")
from inferno.cuda import Device, gpu_count
print("gpus", gpu_count(), "|", Device.open(0) if gpu_count() else "none")
PY
    echo "INFERNO_KERNEL_DIR=${INFERNO_KERNEL_DIR:-unset}"
} 2>&1 | tee "$log"

cmd=("$py" -m pytest -m gpu -q -rfEs --junitxml="$out/gpu_tests.xml" tests/gpu "$@")
echo "+ ${cmd[*]}" | tee -a "$log"
"${cmd[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}

summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran" "$log" | tail -1)
failed=$(grep -E "^(FAILED|ERROR) " "$log" | head -20)
echo
echo "== summary (exit $rc): ${summary:-no pytest summary line; see $log}"
[[ -n "$failed" ]] && echo "$failed"
[[ $rc -eq 5 ]] && echo "pytest collected no GPU tests: check the -m gpu marker and test paths"
exit "$rc"
