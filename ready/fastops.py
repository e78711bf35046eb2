"""Registers the repository's `kernels/` folder as the import package `ready_kernels`.

`kernels/` has no `__init__.py` on purpose: the PyPI distribution `kernels` (pulled in by
sglang and transformers extras) owns the import name `kernels`, and a namespace folder never
shadows a regular package. We import our Triton kernels under a name of our own instead.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"


def register() -> None:
    """Make `import ready_kernels.<op>` load `kernels/<op>.py` (idempotent)."""
    if "ready_kernels" in sys.modules:
        return
    pkg = types.ModuleType("ready_kernels")
    pkg.__path__ = [str(KERNELS_DIR)]  # type: ignore[attr-defined]
    pkg.__doc__ = "The repository's kernels/ folder (Triton kernels beside their torch references)."
    sys.modules["ready_kernels"] = pkg


register()
