#!/usr/bin/env bash
# The GPU probe of the estimate (tools/gpu_estimate_peak.py; its DEFAULT_MODELS, or MODELS=spec,...
# with spec name[:attention][%precision]). On a machine with a CUDA GPU, torch and (ideally)
# transformers 5.17.0, from the repository root (about 5 minutes):
#   OUT=/tmp/gpu_probe_out bash tools/gpu_estimate_peak.sh
# Without a network, put wheels beside the checkout: .whl/tf (transformers 5.24.0 and its
# dependencies, installed only where no transformers is installed), .whl/numpy if numpy is
# missing, .whl/tf517 (5.17.0, the version the measurements used), with which the specs in ALSO
# (empty by default) run again unless the main runs already used 5.17.
# Writes <model>.json/.txt, <model>_trace.pickle (--keep-trace's), summary.json, pip.log, probe.log
# under $OUT and prints the headlines; at the end everything is also packed into $OUT/probe.tgz,
# beside summary.json, probe.log and two .txt. benchmarks/results/estimate_peak_h200_20261126/
# holds its output on an NVIDIA H200.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_probe_out}
mkdir -p "$OUT"
export PROBE_THREADS=${PROBE_THREADS:-2} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
links=()
for d in .whl/tf .whl/numpy .whl; do [ -d "$d" ] && links+=(--find-links "$d"); done
python3 -c "import transformers" 2>/dev/null ||
    python3 -m pip install -q --no-compile "${links[@]}" transformers==5.24.0 >"$OUT/pip.log" 2>&1 ||
    { tail -5 "$OUT/pip.log"; exit 1; }
ver=$(python3 -c "import transformers; print(transformers.__version__)" 2>/dev/null)
also=()
ALSO=${ALSO-}
if [ "${ver%.*}" != 5.17 ] && [ -d .whl/tf517 ] && [ -n "$ALSO" ] &&
    python3 -m pip install -q --no-compile --no-deps --target /tmp/tf517 .whl/tf517/*.whl >>"$OUT/pip.log" 2>&1; then
    also=(--also-with /tmp/tf517 --also-models "$ALSO")
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "installed in ${SECONDS}s; transformers $ver; again with 5.17: ${also[3]:-none}"
export PYTHONPATH=$PWD/src:$PWD/tests
t=$((${TOTAL_TIMEOUT:-275} - SECONDS)) # the whole call, installs included, ends inside 300 s
timeout "$((t > 60 ? t : 60))" python3 tools/gpu_estimate_peak.py --workers "${WORKERS:-8}" \
    --timeout "${PROBE_TIMEOUT:-200}" --brief --out "$OUT" ${MODELS:+--models "$MODELS"} "${also[@]}" >"$OUT/probe.log" 2>&1
rc=$?
sed -n '/^== headlines/,$p' "$OUT/probe.log" | tail -c 11800
[ $rc -eq 0 ] || tail -c 1500 "$OUT/probe.log"
tar czf /tmp/probe.tgz -C "$OUT" . && mv /tmp/probe.tgz "$OUT/" && find "$OUT" -maxdepth 1 -type f ! -name probe.tgz \
    ! -name summary.json ! -name probe.log ! -name rmsnorm_lm_bf16-mixed.txt ! -name llama_bf16-mixed.txt -delete
echo "rc=$rc after ${SECONDS}s; output in $OUT/probe.tgz"
exit $rc
