"""No result from a broken model: checks that a run's model and numbers can be real.

A target whose weights or logits hold NaN/Inf still "decodes" (argmax of NaN is a token), and a
drafter on such a target still gets a τ, so a broken model would otherwise leave a FINISHED run
with numbers that mean nothing. These checks turn that into a `HealthError` (a ValueError: the
sweep worker prints it as one line and the run ends FAILED):

- `check_model` / `check_target`: every weight finite, and the target's logits on a probe prompt;
- `check_metrics`: a run's flat metrics (`<bench>/tau`, `/tps`, ...) are finite and in range;
- `generations_problem`: cached AR generations look like a clean, finished decode.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence


class HealthError(ValueError):
    """A model or an evaluation that cannot be real (NaN/Inf weights or logits, NaN τ, ...)."""


def check_model(module: Any, what: str) -> None:
    """Raise when a floating-point parameter or buffer of `module` holds NaN or Inf."""
    import torch

    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise HealthError(f"{what}: weight {name} holds NaN or Inf values; expected finite weights "
                              "(a broken or corrupted checkpoint)")


def check_target(target: Any, probe: Sequence[int], what: str = "target") -> None:
    """Finite weights, and finite logits for the prompt `probe` (one forward pass, no cache)."""
    import torch

    check_model(target, what)
    if len(probe) == 0:
        return
    device = target.embed_tokens.weight.device
    with torch.no_grad():
        logits = target(torch.tensor([list(probe)], dtype=torch.long, device=device)).logits
    bad = ~torch.isfinite(logits)
    if bool(bad.any()):
        pos = int(bad.any(dim=-1).nonzero()[0, 1])
        raise HealthError(f"{what}: logits hold NaN or Inf (first at probe position {pos} of {len(probe)}); "
                          "expected finite logits from a working model")


_RANGES = {  # metric suffix -> (low, high, what it means)
    "tau": (1.0, math.inf, "committed tokens per round, >= 1"),
    "tps": (0.0, math.inf, "tokens per second, > 0"),
    "rounds": (1.0, math.inf, "verification rounds, >= 1"),
    "new_tokens": (1.0, math.inf, "generated tokens, >= 1"),
    "lossless": (0.0, 1.0, "0 or 1"),
}


def check_metrics(metrics: Mapping[str, Optional[float]], method: str,
                  proposals: Optional[int] = None) -> None:
    """Raise on a metric that cannot come from a real evaluation: NaN/Inf anywhere, τ < 1 (or
    > K + 1 for a drafter with block K), TPS <= 0, no rounds or tokens, survival outside [0, 1],
    or no `overall/tau` at all."""
    for name, value in sorted(metrics.items()):
        if value is None or name.startswith("train/"):
            continue
        v = float(value)
        if not math.isfinite(v):
            raise HealthError(f"method {method!r}: metric {name} is {v}; a broken model or evaluation "
                              "(expected a finite number)")
        suffix = name.rsplit("/", 1)[-1]
        low, high, meaning = _RANGES.get(suffix, (-math.inf, math.inf, ""))
        if suffix.startswith("survival_"):
            low, high, meaning = 0.0, 1.0, "a fraction in [0, 1]"
        if suffix == "tau" and method != "ar" and proposals:
            high = proposals + 1.0
            meaning = f"committed tokens per round, 1 .. K+1 = {proposals + 1}"
        if (suffix == "tps" and v <= 0) or not low - 1e-9 <= v <= high + 1e-9:
            raise HealthError(f"method {method!r}: metric {name} = {v:g}; expected {meaning}")
    if metrics.get("overall/tau") is None:
        raise HealthError(f"method {method!r}: the evaluation produced no overall/tau; expected every "
                          "benchmark to decode at least one prompt, with a budget that lets some round observe every draft "
                          "position (ready.metrics.tau)")


def generations_problem(gens_by_bench: Mapping[str, Iterable[Any]], max_new_tokens: int) -> Optional[str]:
    """What is wrong with cached AR generations (None when they look like a finished, clean decode):
    every prompt has 1..max_new_tokens tokens, a finite positive wall time and a known stop reason."""
    for bench, gens in gens_by_bench.items():
        for i, g in enumerate(gens):
            n = len(g.tokens)
            if not 1 <= n <= max_new_tokens:
                return f"{bench} prompt {i}: {n} new tokens, expected 1 .. {max_new_tokens}"
            if not (math.isfinite(float(g.wall_s)) and g.wall_s > 0):
                return f"{bench} prompt {i}: wall time {g.wall_s!r}, expected a positive number of seconds"
            if g.stop not in ("budget", "eos"):
                return f"{bench} prompt {i}: stop reason {g.stop!r}, expected 'budget' or 'eos'"
    return None


__all__ = ["HealthError", "check_model", "check_target", "check_metrics", "generations_problem"]
