#!/usr/bin/env bash
# The GPU checks of the CUDA set-up order, on a machine with a CUDA GPU, from the repository root
# (OUT=DIR bash tools/gpu_suite.sh):
#
#   1. the four orders in which a profiler can set up CUDA's allocator history and OOM observer,
#      each in its own process (a torch binding called before CUDA is initialised ended in a
#      segmentation fault, exit 139; every case must exit 0);
#   2. `pytest -m cuda`;
#   3. the whole suite, `pytest -q -n 8` (WORKERS=N for another count).
#
# Logs go to $OUT, named with the GPU.
# The machine needs torch and lightning; wheels of what it lacks go in .whl/
# (jsonargparse with docstring-parser and typeshed-client for its `signatures` extra, msgspec).
# The S3 and browser tests skip without moto/s3fs/playwright.
source "$(dirname "$0")/gpu_env.sh"
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0).replace(' ', '_'))") || exit 1
echo "GPU: $gpu"

cases="$OUT/setup_orders_$gpu.txt"
for case in raw_after_init oom_setup history_setup oom_history_after_model; do
    echo "--- $case"
    timeout 300 python3 - "$case" <<'EOF'
import sys, tempfile, torch
from memprofiler import MemProfiler

case = sys.argv[1]
run = {"schedule": {"warmup": 0, "active": 1}, "collect_funcs": {"default": ["s"]}}
if case == "raw_after_init":
    torch.cuda.init()
    print("history enabled:", torch._C._cuda_isHistoryEnabled(), flush=True)
elif case == "oom_setup":  # set-up before the first CUDA tensor
    p = MemProfiler({"oom": {"enabled": True}, **run}, save_dir=tempfile.mkdtemp(), rank=0).setup()
    x = torch.randn(1000, device="cuda")
    p.teardown()
    print("oom set-up, then a CUDA tensor: ok", flush=True)
elif case == "history_setup":
    d = tempfile.mkdtemp()
    with MemProfiler({"cuda_allocator_history": True, **run}, save_dir=d, rank=0) as p, p.profile("s"):
        x = torch.randn(1000, device="cuda")
    import pathlib
    print("history pickles:", sorted(f.name for f in pathlib.Path(d).glob("cuda_alloc_*")), flush=True)
else:  # the Lightning order: the model on the GPU first
    model = torch.nn.Linear(64, 64).cuda()
    cfg = {"oom": {"enabled": True}, "cuda_allocator_history": True, **run}
    with MemProfiler(cfg, save_dir=tempfile.mkdtemp(), rank=0) as p, p.profile("s"):
        model(torch.randn(8, 64, device="cuda")).sum().backward()
    print("model first, then set-up: ok", flush=True)
EOF
    echo "rc=$?"
done 2>&1 | tee "$cases"

python3 -m pytest -q -p no:cacheprovider -m cuda 2>&1 | tee "$OUT/pytest_cuda_$gpu.log" | tail -5
python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-8}" 2>&1 | tee "$OUT/pytest_full_$gpu.log" | tail -25
