#!/usr/bin/env bash
# The whole GPU check in one call of the device machine:
#   env -> install (the README's command) -> build -> pytest (every test, GPU ones included)
#   -> compute-sanitizer memcheck + racecheck -> main job (scratchops run) -> short bench
#   -> the implicit-GEMM conv's accuracy over many draws (scripts/accuracy_probe.py)
#   -> DDP training (scratchops ddp): on a machine of N >= 2 GPUs, NCCL on 1 and on N GPUs
#   (the scaling table's runs) and two ranks sharing GPU 0 through gloo; on one GPU, gloo only.
# Usage: scripts/gpu_check.sh [STEP ...]   (default: all steps, in that order)
# The GPU machine has no network: pip takes what it needs from .whl/ (PIP_NO_INDEX and
# PIP_FIND_LINKS are set below, for the install step and for tests/test_packaging.py's wheel
# builds); fill it first with scripts/fetch_build_wheels.sh (a setuptools wheel; .whl/ is
# git-ignored, so carry it along).
# Logs: $OUT/logs/<step>.log (a temporary folder when OUT is unset); a summary is printed
# last. PACK_LOGS=1 packs the logs into $OUT/logs.tgz (the device tool returns few files).
# RUN_ARGS / BENCH_ARGS pass options on (BENCH_ARGS defaults to --quick; set it to "" for
# the full sweep); PYTEST_ARGS picks tests (default: tests, all of them), e.g.
# PYTEST_ARGS="tests/test_compile.py tests/test_autograd.py" to stay inside a time limit.
# After a fresh build the whole suite does not fit one 10-minute device call even on four
# GPUs: its tail is the nvcc compiles of tests/test_build.py and tests/test_sass.py, which
# need no GPU and run in CI; PYTEST_ARGS="tests --ignore=tests/test_build.py
# --ignore=tests/test_sass.py" leaves them there.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
# The build lives in the checkout (ignored by git), so a warm machine rebuilds only changes.
export SCRATCHOPS_BUILD_DIR=${SCRATCHOPS_BUILD_DIR:-$PWD/.build/kernels}
PY=${PYTHON:-python3}
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl"
LOGS=$OUT/logs
mkdir -p "$LOGS"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(env install build pytest memcheck racecheck run bench accuracy ddp)

SANITIZE="env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --error-exitcode 1 --print-limit 20"
declare -a SUMMARY
run_step() {  # run_step NAME TIMEOUT_SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name: $*"
    timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    tail -n 8 "$LOGS/$name.log"
    local verdict=ok; [ $rc -ne 0 ] && verdict="FAILED (rc $rc)"
    SUMMARY+=("$(printf '%-10s %-16s %4ss' "$name" "$verdict" $((SECONDS - start)))")
}

for step in "${STEPS[@]}"; do
    case $step in
    env) run_step env 60 sh -c "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'; nvcc --version | tail -n 2" ;;
    # The README's install command, verbatim; pip's isolated build takes setuptools from .whl/.
    install)
        ls .whl/setuptools-*.whl > /dev/null 2>&1 ||
            echo "no setuptools wheel in .whl/: run scripts/fetch_build_wheels.sh where there is a network and carry .whl/"
        run_step install 300 $PY -m pip install -e . ;;
    build) run_step build 600 env SCRATCHOPS_VERBOSE_BUILD=1 $PY -c "import scratchops, time; t = time.time(); scratchops.load(); print(f'kernels loaded in {time.time() - t:.1f} s')" ;;
    # On several GPUs with pytest-xdist there: a worker a GPU, a test file's tests on one
    # worker (tests/conftest.py gives each worker its own default GPU).
    pytest)
        GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())')
        SPREAD=""
        [ "$GPUS" -gt 1 ] && $PY -c 'import xdist' 2> /dev/null && SPREAD="-n $GPUS --dist loadfile"
        run_step pytest 900 env SCRATCHOPS_TEST_GPUS="$GPUS" $PY -m pytest ${PYTEST_ARGS:-tests} -q -rs -p no:cacheprovider --durations=12 $SPREAD ;;
    memcheck) run_step memcheck 600 $SANITIZE --tool memcheck $PY scripts/sanitize_driver.py ;;
    racecheck) run_step racecheck 600 $SANITIZE --tool racecheck $PY scripts/sanitize_driver.py ;;
    run) run_step run 900 $PY -m scratchops run --json "$OUT/run.json" ${RUN_ARGS:-} ;;
    bench) run_step bench 900 $PY -m scratchops bench ${BENCH_ARGS---quick} --out "$OUT/bench" ;;
    accuracy) run_step accuracy 300 sh -c "$PY scripts/accuracy_probe.py 40 auto && $PY scripts/accuracy_probe.py 40 mma_sync" ;;
    # DDP_BATCH: the global batch (default KernelBench's 128); DDP_STEPS: the steps of each run.
    ddp)
        GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())')
        DDP="$PY -m scratchops ddp --batch ${DDP_BATCH:-128} --steps ${DDP_STEPS:-20}"
        RUNS="$DDP --nproc-per-node 2 --backend gloo --share-gpu --json $OUT/ddp-gloo-shared.json"
        [ "$GPUS" -ge 2 ] && RUNS="$DDP --nproc-per-node 1 --json $OUT/ddp-1.json && $DDP --nproc-per-node $GPUS --json $OUT/ddp-$GPUS.json && $RUNS"
        run_step ddp 900 sh -c "$RUNS" ;;
    *) echo "unknown step: $step"; exit 2 ;;
    esac
done

echo
echo "=== summary (logs in $LOGS)"
grep -h -E "^(=+ )?[0-9]+ (passed|failed)|ERROR SUMMARY|RACECHECK SUMMARY|mismatches|kernels loaded|^\[ddp\] [0-9]+ models" "$LOGS"/*.log 2>/dev/null
printf '%s\n' "${SUMMARY[@]}"
if [ "${PACK_LOGS:-0}" = 1 ]; then tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"; fi
