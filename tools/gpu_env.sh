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
# The pack hook: through setup.py, or (where the machine's setuptools refuses pyproject.toml) with the
# C compiler directly, recording the source's hash as setup.py does.
if ! python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
    sha=$(sha256sum src/memprofiler/_packer.c | cut -d' ' -f1)
    suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    include=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    cc -O2 -shared -fPIC -I"$include" -DPACKER_SOURCE_SHA256="\"$sha\"" src/memprofiler/_packer.c \
        -o "src/memprofiler/_packer$suffix" >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
