"""Evaluation: decode a benchmark's prompts with AR and with a drafter, check that the
speculative output is token-identical to AR greedy (lossless), and compute the metrics."""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import torch
from tqdm.auto import tqdm

from ready.decode.engine import Engine, Generation, as_prompt, check_prompt
from ready.decode.errors import DecodeError
from ready.decode.protocol import Drafter
from ready.metrics import Metrics, summarize, with_ar


class LosslessWarning(UserWarning):
    """Speculative output differs from AR greedy: a bug in the engine, the target or the drafter plumbing."""


@dataclass
class Mismatch:
    """The first place where the speculative output left the AR output."""

    prompt_index: int
    position: int  # index into the new tokens
    expected: Optional[int]  # AR token (None: AR had stopped)
    got: Optional[int]  # speculative token (None: speculative had stopped)


def first_mismatch(ar: Sequence[int], spec: Sequence[int]) -> Optional[tuple[int, Optional[int], Optional[int]]]:
    """(position, AR token, speculative token) of the first difference, None if identical."""
    for i, (a, s) in enumerate(zip(ar, spec)):
        if a != s:
            return i, a, s
    if len(ar) != len(spec):
        i = min(len(ar), len(spec))
        return i, (ar[i] if i < len(ar) else None), (spec[i] if i < len(spec) else None)
    return None


@dataclass
class PromptResult:
    index: int
    prompt_len: int
    tokens: list[int]
    accepted: list[int]
    horizons: list[int]
    wall_s: float
    ar_wall_s: float
    lossless: int
    committed: list[int] = field(default_factory=list)  # tokens appended per round (tau's numerator)
    donor: Optional[int] = None  # the state placebo: index of the prompt whose states the reader read


@dataclass
class EvalResult:
    """One method on one benchmark, with its AR baseline on the same prompts."""

    benchmark: str
    method: str
    metrics: Metrics  # speculative (or AR when method == "ar"), with speedup and lossless set
    ar: Metrics
    lossless: int
    mismatch: Optional[Mismatch]
    prompts: list[PromptResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _warm_up(engine: Engine, prompts: Sequence[torch.Tensor], max_new_tokens: int, runs: int,
             donor: Optional[torch.Tensor] = None) -> None:
    """Size the cache for the longest prompt (so no timed run reallocates it or recaptures CUDA
    graphs), then run `runs` untimed generations of the first prompt (with a donor when the timed
    ones have donors, so the drafter's graph for the donor cache is captured here too)."""
    engine.reserve(max(p.numel() for p in prompts) + max_new_tokens)
    for _ in range(runs):
        engine.generate(prompts[0], max_new_tokens, **({} if donor is None else {"donor": donor}))


def run_ar(target: Any, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int, *, eos_token_id: Optional[int] = None,
           warmup: int = 1, progress: bool = True, desc: str = "AR",
           cuda_graphs: Optional[bool] = None) -> list[Generation]:
    """Greedy AR generations of every prompt (the lossless reference and the speed baseline)."""
    prompts = [as_prompt(p) for p in prompts]
    for p in prompts:
        check_prompt(target, p, max_new_tokens)
    engine = Engine(target, None, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs)
    if prompts:
        _warm_up(engine, prompts, max_new_tokens, warmup)
    return [engine.generate(p, max_new_tokens) for p in tqdm(prompts, desc=desc, disable=not progress, leave=False)]


def next_prompt_donors(n: int) -> list[int]:
    """The placebo's pairing: prompt i reads the states of prompt i + 1 (the last reads the first)."""
    if n < 2:
        raise DecodeError(f"the state placebo reads another prompt's states, so it needs at least 2 prompts; got {n} "
                          "(raise bench.limit)")
    return [(i + 1) % n for i in range(n)]


def donor_tokens(prompts: Sequence[torch.Tensor], ar: Sequence[Generation], j: int) -> torch.Tensor:
    """Prompt j followed by its greedy AR continuation: the text whose states a placebo reads."""
    return torch.cat([prompts[j].cpu(), torch.tensor(ar[j].tokens, dtype=torch.long)])


def report_lossless_failure(benchmark: str, method: str, mm: Mismatch) -> None:
    msg = (
        f"LOSSLESS FAILURE on {benchmark} ({method}): prompt {mm.prompt_index}, new token {mm.position}: "
        f"AR greedy gave {mm.expected}, speculative decoding gave {mm.got}. Speculative output must equal AR "
        "greedy token for token; this is a bug."
    )
    print("!" * 80 + "\n" + msg + "\n" + "!" * 80, file=sys.stderr, flush=True)
    warnings.warn(msg, LosslessWarning, stacklevel=3)


def evaluate(target: Any, drafter: Optional[Drafter], prompts: Sequence[Sequence[int] | torch.Tensor],
             max_new_tokens: int, *, benchmark: str = "default", method: Optional[str] = None,
             eos_token_id: Optional[int] = None, warmup: int = 1, progress: bool = True,
             ar: Optional[Sequence[Generation]] = None, cuda_graphs: Optional[bool] = None,
             donors: Optional[Sequence[int]] = None, interleave_ar: bool = False) -> EvalResult:
    """Decode every prompt with `drafter` (AR when None) and with AR, compare them, measure.

    `ar` reuses AR generations of the same prompts (the sweep runner decodes AR once per
    benchmark); `warmup` untimed generations of the first prompt precede each timed pass.
    `donors` (the state placebo): for prompt i, the index of another prompt whose committed
    states the drafter reads instead of its own (that prompt followed by its AR continuation).
    `interleave_ar`: time AR afresh in this process, prompt by prompt alternating with the drafter
    (A B A B ...), so each prompt's speedup compares two timings taken side by side (the CUDA
    default); otherwise the speedup uses the timing stored with `ar`.
    """
    ids = [as_prompt(p) for p in prompts]
    if not ids:
        raise DecodeError(f"benchmark {benchmark!r} has no prompts; expected at least one")
    for p in ids:
        check_prompt(target, p, max_new_tokens)
    method = method or ("ar" if drafter is None else type(drafter).__name__.lower())
    if ar is None:
        ar = run_ar(target, ids, max_new_tokens, eos_token_id=eos_token_id, warmup=warmup, progress=progress,
                    desc=f"{benchmark} AR", cuda_graphs=cuda_graphs)
    elif len(ar) != len(ids):
        raise DecodeError(f"got {len(ar)} AR generations for {len(ids)} prompts; expected one per prompt")
    if donors is not None and (drafter is None or len(donors) != len(ids)):
        raise DecodeError(f"got {len(donors)} donors for {len(ids)} prompts and drafter {drafter!r}; expected one "
                          "donor prompt index per prompt and a drafter")
    if drafter is None:
        spec = list(ar)
    else:
        engine = Engine(target, drafter, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs)
        _warm_up(engine, ids, max_new_tokens, warmup,
                 donor=None if donors is None else donor_tokens(ids, ar, donors[0]))
        desc = f"{benchmark} {method}" + (" (donor states)" if donors is not None else "")
        ar_engine = None
        if interleave_ar:
            ar_engine = Engine(target, None, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs)
            _warm_up(ar_engine, ids, max_new_tokens, warmup)
        spec, timed = [], []
        for i, p in enumerate(tqdm(ids, desc=desc, disable=not progress, leave=False)):
            if ar_engine is not None:
                timed.append(ar_engine.generate(p, max_new_tokens))
            spec.append(engine.generate(p, max_new_tokens, donor=None if donors is None else donor_tokens(ids, ar, donors[i])))
        if ar_engine is not None:  # the same tokens as `ar` (lossless is checked against those), timed here
            ar = timed

    results, mismatch = [], None
    for i, (a, s) in enumerate(zip(ar, spec)):
        mm = first_mismatch(a.tokens, s.tokens)
        if mm is not None and mismatch is None:
            mismatch = Mismatch(prompt_index=i, position=mm[0], expected=mm[1], got=mm[2])
        results.append(PromptResult(index=i, prompt_len=s.prompt_len, tokens=s.tokens, accepted=s.accepted,
                                    horizons=s.horizons, wall_s=s.wall_s, ar_wall_s=a.wall_s, lossless=int(mm is None),
                                    committed=list(s.committed), donor=None if donors is None else int(donors[i])))
    lossless = int(mismatch is None)
    if mismatch is not None:
        report_lossless_failure(benchmark, method, mismatch)

    k = drafter.block_size if drafter is not None else 0
    ar_metrics = summarize([g.log() for g in ar], benchmark, "ar", 0)
    ar_metrics.lossless, ar_metrics.speedup = 1, 1.0
    metrics = summarize([g.log() for g in spec], benchmark, method, k)
    with_ar(metrics, ar_metrics)
    metrics.lossless = lossless
    return EvalResult(benchmark=benchmark, method=method, metrics=metrics, ar=ar_metrics, lossless=lossless,
                      mismatch=mismatch, prompts=results)
