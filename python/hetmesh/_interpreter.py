"""Which interpreter the package was built for, and import errors that say so: the native module
loads in that Python only, and the torch a program needs is its interpreter's."""

from __future__ import annotations

import importlib
import os
import sys

try:  # written by CMake beside the package
    from ._build import PYTHON as BUILT_FOR, PYTHON_VERSION as _BUILT_VERSION
except ImportError:
    BUILT_FOR, _BUILT_VERSION = None, None


def _launcher() -> str | None:
    """The hetmesh-python launcher: beside the package in a build tree, in <prefix>/bin once
    installed (<prefix>/lib/python3/dist-packages/hetmesh)."""
    above = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (os.path.join(above, "hetmesh-python"),
                 os.path.join(above, "..", "..", "..", "bin", "hetmesh-python")):
        if os.access(path, os.X_OK):
            return os.path.normpath(path)
    return None


def _same_interpreter() -> bool:
    return BUILT_FOR is not None and (
        os.path.realpath(sys.executable) == os.path.realpath(BUILT_FOR))


def how_to_run() -> str:
    """Which interpreter hetmesh is for, and how to run a program with it."""
    if BUILT_FOR is None:
        return "hetmesh does not know which interpreter it was built for (no hetmesh/_build.py)"
    this = f"{sys.executable} (Python {sys.version_info[0]}.{sys.version_info[1]})"
    if _same_interpreter():
        return f"hetmesh was built for this interpreter, {this}"
    launcher = _launcher()
    run = (f"run the program with {launcher} (that interpreter, with hetmesh on its path)"
           if launcher else f"run the program with {BUILT_FOR}")
    return (f"hetmesh was built for {BUILT_FOR} (Python {_BUILT_VERSION}), and this is {this}: "
            f"{run}, or build hetmesh for this one (cmake -DHETMESH_PYTHON={sys.executable})")


def native_module():
    """hetmesh._native, or an ImportError that names the interpreter it is for."""
    # torch first, where there is one: a CUDA wheel of torch imported after hetmesh's transport
    # library had loaded aborted the process ("free(): invalid pointer", torch 2.11+cu130 on the
    # GPU machine), while the other order works; a program that imports hetmesh first must not die.
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    try:
        return importlib.import_module("._native", __package__)
    except ImportError as e:
        if _same_interpreter():
            raise
        raise ImportError(f"hetmesh's native module does not load here ({e}); {how_to_run()}",
                          name=e.name, path=e.path) from e


def import_torch():
    """torch, or an ImportError that says which interpreter hetmesh was built for (the one whose
    torch the package is tested with) and how to run the program with it."""
    try:
        import torch
    except ImportError as e:
        fix = ": install torch for it (Debian: python3-torch)" if _same_interpreter() else ""
        raise ImportError(f"{e} in {sys.executable}; {how_to_run()}{fix}", name=e.name,
                          path=e.path) from e
    return torch
