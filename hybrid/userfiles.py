"""A user's Python file, run as a module: custom rewards, tool files, tool parsers, agent
environments. One loader, so each kind reports a missing file or a failing import alike,
naming what the file was for."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def one_line(error: BaseException) -> str:
    """`Type: message` on one line (a message's own line breaks folded)."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def import_python_file(path: str | Path, module_prefix: str, what: str) -> ModuleType:
    """Execute the Python file at `path` as a module named `<module_prefix>_<stem>`; `what`
    names the file in errors ("tool file", "custom reward file")."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    module_name = f"{module_prefix}_{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{what} {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered only while it runs (dataclasses look their module up); left out of sys.modules
    # afterwards so that cloudpickle ships its functions by value to Ray workers.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise ValueError(f"{what} {path} raised while loading: {one_line(error)}") from error
    finally:
        sys.modules.pop(module_name, None)
    return module
