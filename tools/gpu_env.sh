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
# compilers directly, recording the sources' hash as setup.py does. Its C++ part (the tensor facts)
# is built against the machine's torch; without it the hook reads tensors through Python.
if ! python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
    src=src/memprofiler
    suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    include=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    sha=$(cat $src/_packer.c $src/_tensor_facts.h | sha256sum | cut -d' ' -f1)
    cc -O2 -shared -fPIC -I"$include" -DPACKER_SOURCE_SHA256="\"$sha\"" $src/_packer.c \
        -o "$src/_packer$suffix" >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
    sha=$(cat $src/_tensor_facts.cpp $src/_tensor_facts.h | sha256sum | cut -d' ' -f1)
    flags=$(python3 -c "
import torch
from torch.utils.cpp_extension import include_paths, library_paths
print(' '.join(['-I' + p for p in include_paths()] + ['-L' + p for p in library_paths()]),
      '-D_GLIBCXX_USE_CXX11_ABI=%d' % int(torch._C._GLIBCXX_USE_CXX11_ABI),
      '-DFACTS_TORCH_VERSION=\"%s\"' % torch.__version__)")
    # shellcheck disable=SC2086
    g++ -O2 -shared -fPIC -std=c++20 -fvisibility=hidden -I"$include" $flags -DFACTS_SOURCE_SHA256="\"$sha\"" \
        $src/_tensor_facts.cpp -lc10 -ltorch -ltorch_cpu -ltorch_python -o "$src/_tensor_facts$suffix" \
        >>"$OUT/build.log" 2>&1 || echo "tensor facts not built: the hook reads tensors through Python" >&2
fi
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
