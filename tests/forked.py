"""Child processes forked from one preloaded server per pytest process, not started afresh.

A fresh `python` child that imports torch, transformers and vLLM spends about 6 s of CPU on
the imports and 2 more tearing the interpreter down at exit, on a 2-core CPU; the suite starts
dozens (gloo ranks, fresh vLLM engines). Forked from Python's forkserver, which imported
them once (`PRELOADED`), a child starts in milliseconds and ends with `os._exit`. Each child
takes the environment its parent has at the call (the server's is from when it started), so
a test may still change it for its children.

The server is one per pytest process (multiprocessing keeps one) and ends with it. Its
imports count only when it starts: the first caller's `modules` join `PRELOADED`.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path

PRELOADED = [
    "torch",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "transformers",
    "vllm.entrypoints.llm",
    "hybrid.models",
    "hybrid.workers.fsdp",
    "hybrid.workers.checkpoint",
    "hybrid.rollout.vllm_compat",
]
"""What the server imports before it forks its first child."""


def forkserver(*modules: str) -> str:
    """The start method to pass to multiprocessing, with `modules` preloaded besides
    PRELOADED if the server has not started yet."""
    multiprocessing.set_forkserver_preload([*PRELOADED, *modules])
    return "forkserver"


def run_python(
    code: str, *argv: str, env: Mapping[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -c code argv...` with `env` (in `cwd`), as `subprocess.run(...,
    capture_output=True, text=True)` returns it (a child killed by a signal has returncode
    -signal), forked from the server. Raises subprocess.TimeoutExpired after `timeout` seconds
    (the child killed)."""
    context = multiprocessing.get_context(forkserver())
    with tempfile.TemporaryDirectory(prefix="forked-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        where = str(cwd or Path.cwd())
        child = context.Process(
            target=_run, args=(code, argv, dict(env), where, str(out), str(err))
        )
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["-c", code, *argv], timeout)
        assert child.exitcode is not None
        return subprocess.CompletedProcess(
            ["-c", code, *argv], child.exitcode, out.read_text(), err.read_text()
        )


def check_python(
    code: str, *argv: str, env: Mapping[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """run_python that fails the test, quoting the child's output, unless the child exits 0."""
    done = run_python(code, *argv, env=env, timeout=timeout, cwd=cwd)
    output = f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, f"child exited {done.returncode}:\n{output}"
    return done


def _run(
    code: str, argv: tuple[str, ...], environ: dict[str, str], cwd: str, out: str, err: str
) -> None:
    """The child: stdout and stderr (the file descriptors, so C-level output too) into the
    files, the environment, directory and argv of the call, then the code as __main__."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.argv = ["-c", *argv]
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as done:  # as the interpreter reads sys.exit's argument
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
        _exit(done.code if isinstance(done.code, int) else int(done.code is not None))
    except BaseException:
        traceback.print_exc()
        _exit(1)
    _exit(0)


def _exit(status: int) -> None:
    """Leave without the interpreter's teardown (what a fresh child spent seconds on)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
