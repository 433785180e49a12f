# Sourced by the GPU scripts (gpu_suite.sh, gpu_perf_round.sh), from the repository root: $OUT
# made, wheels of what the machine lacks (.whl/*.whl) installed aside, the pack hook built in
# place, and src/ and tests/ on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-/tmp/memprofiler_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
