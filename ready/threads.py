"""torch's CPU threads for one computation.

CPU matrix products and reductions add in an order that depends on the thread count, so a CPU run's
numbers depend on it: the embedded target pretrained on one thread and on two differ (held-out loss
4.605 against 4.731, 6 Dec), and so does every row trained from it. Whatever is kept therefore runs
on the thread count its config names (`threads.shared`, `threads.drafters`), never on the machine's
load, and that count is part of its hash.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional


@contextmanager
def cpu_threads(n: Optional[int]) -> Iterator[None]:
    """torch's CPU threads set to `n` inside the block (left alone when None), restored after it."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(before)
