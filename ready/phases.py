"""Where a sweep row's time and GPU memory go: a per-process record of named phases.

A row's work happens at several depths (the row runner loads the target and evaluates, the pipeline
trains its stages, the conversation builder regenerates), so each place wraps its expensive part in
`PHASES.phase(name)` and the row runner takes the record when the row ends (`PHASES.take()`). A phase
records its wall seconds (after a device synchronisation, so queued kernels are counted where they ran)
and, on CUDA, the peak GPU memory allocated while it ran (`torch.cuda.max_memory_allocated`, reset when
the phase starts): the number that says whether a 27B row fits a card, phase by phase. A phase entered
again in the same row adds its seconds and keeps the larger peak. Phases nest: an inner phase's seconds
are part of the outer one's, and the outer phase's peak covers the inner one's (the peak before the
inner reset is carried over).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass
class Phase:
    """One named phase of a row: wall seconds (summed over its entries), peak GPU bytes (None off CUDA), entries."""

    seconds: float = 0.0
    peak_bytes: Optional[int] = None
    calls: int = 0


class PhaseRecord:
    """Named phases in the order they first ran, since the last `take`."""

    def __init__(self) -> None:
        self.phases: dict[str, Phase] = {}
        self._open: list[int] = []  # per running phase (outermost first): its peak bytes before inner resets
        self.failed_in: Optional[str] = None  # the innermost phase an exception left, since the last `take`

    @contextmanager
    def phase(self, name: str, device: Optional[torch.device | str] = None) -> Iterator[None]:
        """Time the block as phase `name`; on a CUDA `device` (default: the current CUDA device when CUDA is
        initialised) also its peak allocated memory."""
        dev = _cuda_device(device)
        if dev is not None:
            torch.cuda.synchronize(dev)
            if self._open:  # the enclosing phase keeps the peak it saw before this reset
                self._open[-1] = max(self._open[-1], int(torch.cuda.max_memory_allocated(dev)))
            torch.cuda.reset_peak_memory_stats(dev)
        self._open.append(0)
        t0 = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed_in = self.failed_in or name
            raise
        finally:
            carried = self._open.pop()
            if dev is not None:
                torch.cuda.synchronize(dev)
            rec = self.phases.setdefault(name, Phase())
            rec.seconds += time.perf_counter() - t0
            rec.calls += 1
            if dev is not None:
                peak = max(carried, int(torch.cuda.max_memory_allocated(dev)))
                rec.peak_bytes = peak if rec.peak_bytes is None else max(rec.peak_bytes, peak)
                if self._open:
                    self._open[-1] = max(self._open[-1], peak)

    def take(self) -> dict[str, Phase]:
        """The phases recorded since the last call, and a fresh record."""
        out, self.phases, self.failed_in = self.phases, {}, None
        return out


def _cuda_device(device: Optional[torch.device | str]) -> Optional[torch.device]:
    if device is not None:
        dev = torch.device(device)
        return dev if dev.type == "cuda" else None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def phase_metrics(phases: dict[str, Phase], prefix: str = "phase") -> dict[str, float]:
    """MLflow metrics of a record: `<prefix>/<name>_s` and, on CUDA, `<prefix>/<name>_peak_gb` (1e9 bytes,
    as benchmarks.train_scale reports peaks)."""
    out: dict[str, float] = {}
    for name, p in phases.items():
        out[f"{prefix}/{name}_s"] = round(p.seconds, 3)
        if p.peak_bytes is not None:
            out[f"{prefix}/{name}_peak_gb"] = round(p.peak_bytes / 1e9, 3)
    return out


PHASES = PhaseRecord()  # the process's record: a sweep worker runs one row at a time
