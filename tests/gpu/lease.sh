#!/usr/bin/env bash
# The whole first-GPU check in one device call: the gpu-marked tests and the four smoke scripts
# (about 2.5 minutes of work on an H200, 2026-11-26; the budgets below leave room for a slower
# card). Each script gets a wall-clock budget and skips the sections that would overrun it.
# Results go to $OUT/smoke.tgz, re-packed after every step so a cut-off run still returns them.
# Usage (on the GPU machine, repository root): bash tests/gpu/lease.sh [fsdp_s fakepg_s copies_s moe_s]
set -u
export PYTHONUNBUFFERED=1
FSDP_S=${1:-120}; FAKEPG_S=${2:-120}; COPIES_S=${3:-120}; MOE_S=${4:-90}
OUT_DIR=${OUT:-out}; WORK=/tmp/smoke; mkdir -p "$WORK" "$OUT_DIR"
pack() { tar -czf "$OUT_DIR/smoke.tgz" -C "$WORK" . 2>/dev/null; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch,torch.distributed as d;print(torch.__version__,torch.version.cuda,torch.cuda.get_device_capability(),'all_gather_single',hasattr(d,'all_gather_single'))"
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|transformers|peft|triton|vllm|ray|flash|liger|safetensors|pyarrow) '
} 2>&1 | tee "$WORK/env.txt"; pack
timeout 60 python3 -m pytest tests/gpu -q -p no:cacheprovider -rs 2>&1 | tail -5 | tee "$WORK/pytest.txt"; pack
timeout $((FSDP_S + 40)) python3 tests/gpu/smoke_fsdp.py --out "$WORK" --budget-s "$FSDP_S" --mfu-profile 2>&1 | tee "$WORK/fsdp.out" | grep -vE '^\s*$' | tail -40; pack
timeout $((FAKEPG_S + 40)) python3 tests/gpu/smoke_fakepg.py --world 8 --shape qwen2.5-7b --vocab-size 152064 --out "$WORK" --budget-s "$FAKEPG_S" 2>&1 | tee "$WORK/fakepg.out" | tail -30; pack
timeout $((COPIES_S + 30)) python3 tests/gpu/smoke_copies.py --out "$WORK" --budget-s "$COPIES_S" 2>&1 | tee "$WORK/copies.out" | tail -15; pack
timeout $((MOE_S + 30)) python3 tests/gpu/smoke_moe.py --out "$WORK" --budget-s "$MOE_S" 2>&1 | tee "$WORK/moe.out" | tail -15; pack
ls -la "$WORK"
