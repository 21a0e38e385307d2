#!/usr/bin/env bash
# The whole first-GPU check in one device call: the gpu-marked tests and the smoke scripts
# (the first four: about 2.5 minutes of work on an H200, 2026-11-26; the budgets below leave
# room for a slower card). Each script gets a wall-clock budget and skips the sections that
# would overrun it. Results go to $OUT/smoke.tgz, re-packed after every step so a cut-off run
# still returns them.
# Usage (on the GPU machine, repository root):
#   bash tests/gpu/lease.sh [fsdp_s fakepg_s copies_s moe_s update_s pytest_s]
#   ONLY="pytest update" bash tests/gpu/lease.sh     # just those steps (env always runs);
#                                                    # steps: pytest fsdp fakepg copies moe update
# liger-kernel (the fused settings of smoke_update.py and the liger tests of
# test_update_kernels_gpu.py) is installed from .whl/liger_kernel-*.whl when the call carries
# that gitignored folder (run's carry: [".whl"]; tests/gpu/README.md says how to fetch the
# wheel); without it those parts skip.
set -u
export PYTHONUNBUFFERED=1
FSDP_S=${1:-120}; FAKEPG_S=${2:-120}; COPIES_S=${3:-120}; MOE_S=${4:-90}; UPDATE_S=${5:-180}
PYTEST_S=${6:-240}
OUT_DIR=${OUT:-out}; WORK=/tmp/smoke; mkdir -p "$WORK" "$OUT_DIR"
pack() { tar -czf "$OUT_DIR/smoke.tgz" -C "$WORK" . 2>/dev/null; }
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
LIGER_WHEEL=$(ls .whl/liger_kernel-*.whl 2>/dev/null | sort -V | tail -1)
if [ -n "$LIGER_WHEEL" ]; then  # pure Python; needs only torch and triton, both there
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$LIGER_WHEEL"; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "installing $LIGER_WHEEL failed: the fused parts skip"; LIGER_WHEEL=""
  fi
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch,torch.distributed as d;print(torch.__version__,torch.version.cuda,torch.cuda.get_device_capability(),'all_gather_single',hasattr(d,'all_gather_single'))"
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|transformers|peft|triton|vllm|ray|flash|liger|safetensors|pyarrow) '
  python3 -c "import liger_kernel.transformers.monkey_patch as m,importlib.metadata as im;print('liger-kernel',im.version('liger-kernel'),'imports; qwen2' if 'qwen2' in m.MODEL_TYPE_TO_APPLY_LIGER_FN else '')" 2>&1 | tail -1
  echo "liger wheel: ${LIGER_WHEEL:-none in .whl/ (the fused parts skip)}"
} 2>&1 | tee "$WORK/env.txt"; pack
want pytest && { SMOKE_OUT="$WORK" timeout "$PYTEST_S" python3 -m pytest tests/gpu -q -p no:cacheprovider -rs -s 2>&1 | tee "$WORK/pytest.txt" | grep -E '^\[|passed|failed|skipped|SKIPPED|FAILED|Error' | tail -40; pack; }
want fsdp && { timeout $((FSDP_S + 40)) python3 tests/gpu/smoke_fsdp.py --out "$WORK" --budget-s "$FSDP_S" --mfu-profile 2>&1 | tee "$WORK/fsdp.out" | grep -vE '^\s*$' | tail -40; pack; }
want fakepg && { timeout $((FAKEPG_S + 40)) python3 tests/gpu/smoke_fakepg.py --world 8 --shape qwen2.5-7b --vocab-size 152064 --out "$WORK" --budget-s "$FAKEPG_S" 2>&1 | tee "$WORK/fakepg.out" | tail -30; pack; }
want copies && { timeout $((COPIES_S + 30)) python3 tests/gpu/smoke_copies.py --out "$WORK" --budget-s "$COPIES_S" 2>&1 | tee "$WORK/copies.out" | tail -15; pack; }
want moe && { timeout $((MOE_S + 30)) python3 tests/gpu/smoke_moe.py --out "$WORK" --budget-s "$MOE_S" 2>&1 | tee "$WORK/moe.out" | tail -15; pack; }
want update && { timeout $((UPDATE_S + 40)) python3 tests/gpu/smoke_update.py --out "$WORK" --budget-s "$UPDATE_S" --mfu-profile 2>&1 | tee "$WORK/update.out" | grep -vE '^\s*$' | tail -25; pack; }
ls -la "$WORK"
