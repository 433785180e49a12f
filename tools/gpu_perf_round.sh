#!/usr/bin/env bash
# The performance checks that need a GPU, in one call of a lent machine, from the repository root
# (OUT=DIR bash tools/gpu_perf_round.sh; about 8 minutes on an H200):
#
#   1. tools/gpu_call_cost.py: each part of a collected call alone, then whole GPT-2 124M
#      (bf16-mixed) and 600-module steps per profiler variant, torch.profiler beside them;
#   2. benchmarks/overhead.py on CUDA: the residual MLPs in a plain loop and a Trainer, with
#      torch.profiler and CUDA memory history side by side.
#
# Each writes its result file (named by the GPU and the date) and its log to $OUT. DRY=1 runs both
# on CPU at their smallest sizes (the fake allocator, --smoke), to check the script anywhere.
# The machine needs torch and lightning; wheels of what it lacks go in .whl/ (see gpu_suite.sh).
source "$(dirname "$0")/gpu_env.sh"
python3 -c "from memprofiler.collectors import saved_tensors as s; print('pack hook:', s.packer_build(), s.NO_TENSOR_FACTS)"
if [ "${DRY:-0}" = 1 ]; then
    cost=(--dry-run --rounds 1 --steps 2 --calls 5)
    overhead=(--smoke --devices cpu)
else
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" \
        || exit 1
    cost=()
    overhead=(--devices cuda --steps 30 --warmup 3 --repeats 1)
fi
rc=0
echo "--- gpu_call_cost"
timeout 330 python3 tools/gpu_call_cost.py "${cost[@]}" --out "$OUT" >"$OUT/gpu_call_cost.log" 2>&1 || rc=1
tail -3 "$OUT/gpu_call_cost.log"
echo "--- overhead"
timeout 240 python3 benchmarks/overhead.py "${overhead[@]}" --out "$OUT" >"$OUT/overhead.log" 2>&1 || rc=1
grep -v "^USDT" "$OUT/overhead.log" | tail -3
ls "$OUT"
exit $rc
