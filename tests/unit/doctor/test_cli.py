"""`python -m hybrid.doctor` on this machine: the CPU demo can run (exit 0, as a user runs it,
in a process of its own), the 8-GPU preset cannot (exit 1, naming the GPUs), bad input exits 2
naming it; the last line is JSON either way. The last two call the entry point's `main` in this
process (a process of its own costs seconds of imports, and the exit code is main's). Importing
the doctor imports no vLLM and starts no Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def doctor(*args: str) -> tuple[int, str, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "hybrid.doctor", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = done.stdout.strip().splitlines()[-1]
    return done.returncode, done.stdout + done.stderr, json.loads(last)


def doctor_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, dict]:
    from hybrid.doctor.__main__ import main

    code = main(list(args))
    captured = capsys.readouterr()
    last = captured.out.strip().splitlines()[-1]
    return code, captured.out + captured.err, json.loads(last)


def test_the_cpu_demo_can_run_here() -> None:
    code, out, verdict = doctor()
    assert code == 0, out
    assert verdict["can_run"] is True and verdict["device"] == "cpu"
    assert verdict["missing"] == []


def test_the_8_gpu_preset_cannot_run_here(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    code, out, verdict = doctor_main(capsys, "--config-name", "qwen2_5_7b_gsm8k_8gpu")
    assert code == 1, out
    assert verdict["can_run"] is False and verdict["device"] == "cuda"
    if torch.cuda.device_count() < 8:
        visible = torch.cuda.device_count()
        assert f"8 CUDA GPUs ({visible} visible)" in verdict["missing"]
    assert verdict["plan"]["model"] == "Qwen2.5-7B"  # matched from the config name


def test_bad_input_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, verdict = doctor_main(capsys, "--config-name", "no_such_config")
    assert code == 2
    assert "--config-name" in verdict["error"] and "no_such_config" in out


def test_importing_the_doctor_imports_no_vllm_and_starts_no_ray() -> None:
    code = (
        "import sys, hybrid.doctor.__main__, hybrid.doctor.diagnose\n"
        "assert 'vllm' not in sys.modules, 'vllm imported'\n"
        "ray = sys.modules.get('ray')\n"
        "assert ray is None or not ray.is_initialized(), 'ray started'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
