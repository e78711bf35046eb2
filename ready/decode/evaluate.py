"""Evaluation: decode a benchmark's prompts with AR and with a drafter, check the speculative
output against greedy decoding, and compute the metrics.

Two checks (docs/sweeps.md "Lossless"):

- `lossless_exact`: the speculative tokens equal the AR tokens, token for token. In float32 and in
  the target's exact mode (`target.exact`) this is the claim. In 16-bit fast mode, verify (K+1 rows)
  and the AR step (1 row) round differently, and a near-tie can flip the argmax.
- `greedy_valid`: every committed token is the target's greedy choice given the committed prefix, up
  to a tie margin measured in the target's own logits. Where a prompt's output leaves the AR output,
  one teacher-forced pass of the target over prompt + output scores it: at the first divergence both
  the AR token and the speculative token must lie within the margin of the top-1 logit (a tie flip,
  counted), and every later speculative token too (a token below the top-1 but within the margin is
  another flip). A token beyond the margin is a loud failure. The margin of a position is the larger
  of `tie_rel * max(|top-1 logit|, std of its logits)` (`TIE_REL`, per dtype) and NOISE_MULT times the
  prompt's noise floor: the largest amount by which a token of the common prefix (before the first
  divergence, where the AR and speculative outputs agree) falls short of the teacher pass's top-1.
  Those tokens are greedy by definition (AR chose them), so that shortfall is what two correct
  forward paths disagree by on this target in this dtype; a later token may not fall short by more
  than NOISE_MULT times it.
  `min_margin` is the
  smallest signed margin seen over the scored tokens: logit of the committed token minus the best
  other logit (negative where another token was higher). `lossless` (what tables use) = greedy_valid.

Verification (`verify_schedule`, `ready.decode.schedule`): every generation records the drafts each round
verified and, from a drafter with a confidence head, the head's confidences; `EvalResult.verification`
is the benchmark's record of them (`ready.calibration.verification_summary`: tokens verified per round,
the head's calibration per draft position), under either schedule.

Sampling (`sampling` with temperature > 0): every prompt is decoded `samples` times, sample s of
prompt i with seed `sample_seed(sampling.seed, i, s, benchmark)` in every row (AR too), so rows pair
(prompt, sample) by (prompt, sample). Tokens are no longer comparable with AR: `lossless` becomes
`dist_valid`, the distribution check of the first `check_rounds` rounds of every generation
(`ready.decode.dist_check`); `lossless_exact` and `greedy_valid` are None.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from tqdm.auto import tqdm

from ready.decode.dist_check import DistValidity, check_distribution, teacher_forced_logits
from ready.decode.engine import BatchResult, Engine
from ready.decode.rounds import Generation, as_prompt, check_prompt
from ready.decode.errors import DecodeError
from ready.decode.protocol import Drafter
from ready.decode.sampling import SamplingParams, sample_seed
from ready.decode.schedule import VerifySchedule
from ready.calibration import verification_summary
from ready.metrics import Metrics, summarize, with_ar


class LosslessWarning(UserWarning):
    """Speculative output is not greedy (beyond the tie margin), or differs from AR in exact mode: a bug in
    the engine, the target or the drafter plumbing."""


# Tie margin per dtype, relative to max(|top-1 logit|, std of the row's logits). 16-bit: the logits'
# rounding noise between two numerically different but correct forward paths (verify vs step vs the
# teacher-forced pass) is ~1-2 % of that scale after 64 layers, the margin about 4x that (2^-4 for
# bfloat16); float32 paths differ by ~1e-6 relative.
TIE_REL = {torch.bfloat16: 2.0**-4, torch.float16: 2.0**-7, torch.float32: 1e-4, torch.float64: 1e-9}


NOISE_MULT = 2.0  # margin >= this times the prompt's noise floor (common-prefix tokens' shortfall)


def tie_rel_for(dtype: torch.dtype) -> float:
    return TIE_REL.get(dtype, 2.0**-4)


@dataclass
class Validity:
    """The greedy-validity check of one prompt's speculative output (see the module docstring)."""

    lossless_exact: int  # identical to the AR tokens
    greedy_valid: int  # every token greedy up to the tie margin
    tie_flips: int  # tokens within the margin of, but not equal to, the path-independent choice
    min_margin: Optional[float] = None  # smallest signed margin over the scored tokens (None: none scored)
    failure: Optional[dict] = None  # the first token beyond the margin: position, token, top1, deficit, margin
    noise_floor: Optional[float] = None  # largest shortfall of a common-prefix token in the teacher pass


def check_greedy(target: Any, prompt: torch.Tensor, ar_tokens: Sequence[int], spec_tokens: Sequence[int],
                 tie_rel: Optional[float] = None) -> Validity:
    """lossless_exact, and greedy_valid with its tie flips, for one prompt (module docstring)."""
    mm = first_mismatch(ar_tokens, spec_tokens)
    if mm is None:
        return Validity(lossless_exact=1, greedy_valid=1, tie_flips=0)
    pos = mm[0]
    if pos >= len(spec_tokens):  # the speculative output stopped early without its own stop token
        return Validity(0, 0, 0, None, {"position": pos, "token": None, "reason": "speculative output stopped early"})
    rel = tie_rel_for(target.dtype) if tie_rel is None else float(tie_rel)
    logits = teacher_forced_logits(target, as_prompt(prompt), spec_tokens)
    noise = 0.0
    if pos:  # the common prefix: tokens both paths chose, greedy by definition
        pre = torch.tensor(list(spec_tokens[:pos]), device=logits.device)
        noise = float((logits[:pos].max(-1).values - logits[:pos].gather(1, pre[:, None])[:, 0]).max())
    flips, min_margin, failure = 0, None, None
    for i in range(pos, len(spec_tokens)):
        row = logits[i]
        top_val, top_tok = (float(v) for v in row.max(0))
        margin = max(rel * max(abs(top_val), float(row.std())), NOISE_MULT * noise)
        toks = [spec_tokens[i]] + ([ar_tokens[i]] if i == pos and ar_tokens[i:i + 1] else [])
        for who, tok in zip(("speculative", "AR"), toks):
            deficit = top_val - float(row[tok])
            if deficit > margin and failure is None:
                failure = {"position": i, "who": who, "token": int(tok), "top1": int(top_tok),
                           "deficit": deficit, "margin": margin}
        tok = spec_tokens[i]
        other = row.clone()
        other[tok] = float("-inf")
        signed = float(row[tok]) - float(other.max())
        min_margin = signed if min_margin is None else min(min_margin, signed)
        if i == pos or signed < 0:
            flips += 1
    return Validity(lossless_exact=0, greedy_valid=int(failure is None), tie_flips=flips, min_margin=min_margin,
                    failure=failure, noise_floor=noise)


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
    lossless: int  # = greedy_valid (what tables use); sampled: dist_valid
    committed: list[int] = field(default_factory=list)  # tokens appended per round (tau's numerator)
    donor: Optional[int] = None  # the state placebo: index of the prompt whose states the reader read
    lossless_exact: Optional[int] = 1  # identical to the AR tokens (None when sampled)
    greedy_valid: Optional[int] = 1  # every token greedy up to the tie margin (module docstring; None when sampled)
    tie_flips: int = 0
    min_margin: Optional[float] = None  # smallest signed margin over the scored tokens (None: nothing scored)
    noise_floor: Optional[float] = None  # the margin's noise floor (None: nothing scored)
    sample: int = 0  # which sample of this prompt (sampling: 0 .. samples-1)
    seed: Optional[int] = None  # the generation's seed (sampling; the same in every row)
    dist_valid: Optional[int] = None  # sampling: the distribution check passed (ready.decode.dist_check)
    dist_rounds: int = 0  # rounds it checked
    rule_err: Optional[float] = None  # largest |law - p| of the acceptance rule (<= 1e-6)
    state_err: Optional[float] = None  # largest target-logit deviation over its margin (<= 1)
    verified: list[int] = field(default_factory=list)  # drafts verified per round (`Generation.verified`)
    confidence: list[list[float]] = field(default_factory=list)  # the head's step confidences per round


@dataclass
class EvalResult:
    """One method on one benchmark, with its AR baseline on the same prompts."""

    benchmark: str
    method: str
    metrics: Metrics  # speculative (or AR when method == "ar"), with speedup and lossless set
    ar: Metrics
    lossless: int  # = greedy_valid: what tables use
    mismatch: Optional[Mismatch]  # the first token that differs from AR (tie flip or failure)
    prompts: list[PromptResult] = field(default_factory=list)
    lossless_exact: Optional[int] = 1  # every prompt identical to AR (None when sampled)
    greedy_valid: Optional[int] = 1  # every prompt greedy up to the tie margin (None when sampled)
    tie_flips: int = 0  # summed over prompts
    min_margin: Optional[float] = None  # smallest over prompts (None: every prompt identical to AR)
    exact: bool = False  # the target ran in exact mode
    sampling: Optional[dict] = None  # {"temperature", "top_p", "seed", "samples"} when sampled
    dist_valid: Optional[int] = None  # sampled: every generation's checked rounds passed
    dist_rounds: int = 0  # rounds checked, summed
    rule_err: Optional[float] = None  # largest over generations
    state_err: Optional[float] = None
    concurrency: int = 1  # sequences the drafting (or AR) row decoded together (ready.decode.engine)
    # drafting rows: the verify schedule, tokens verified per round and the head's calibration
    # (`ready.calibration.verification_summary`); None for AR
    verification: Optional[dict] = None

    def validity(self) -> dict[str, Any]:
        """The per-benchmark keys of evaluation.json: lossless (= greedy_valid, or dist_valid when sampled),
        lossless_exact, greedy_valid (None when sampled), tie_flips, min_margin, exact, sampling, dist_valid,
        dist_rounds, rule_err, state_err, concurrency."""
        return {"lossless": self.lossless, "lossless_exact": self.lossless_exact, "greedy_valid": self.greedy_valid,
                "tie_flips": self.tie_flips, "min_margin": self.min_margin, "exact": self.exact,
                "sampling": self.sampling, "dist_valid": self.dist_valid, "dist_rounds": self.dist_rounds,
                "rule_err": self.rule_err, "state_err": self.state_err, "concurrency": self.concurrency}

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


def set_exact(target: Any, exact: Optional[bool]) -> None:
    """Put the target in (or out of) exact mode; None leaves it as it is."""
    if exact is not None:
        target.exact = bool(exact)


def sampled(sampling: Optional[SamplingParams]) -> Optional[SamplingParams]:
    """The params when they sample (temperature > 0), None for greedy."""
    return None if sampling is None or sampling.greedy else sampling


def units(n_prompts: int, sampling: Optional[SamplingParams], samples: int,
          stream: str = "") -> list[tuple[int, int, Optional[int]]]:
    """(prompt index, sample, seed) of every generation, prompt-major: one per prompt when greedy,
    `samples` per prompt when sampling (seeds shared by every row of a setting; `stream`, the benchmark,
    keeps benchmarks' random numbers apart)."""
    sampling = sampled(sampling)
    if sampling is None:
        return [(i, 0, None) for i in range(n_prompts)]
    if samples < 1:
        raise DecodeError(f"samples per prompt = {samples}; expected an integer >= 1")
    return [(i, s, sample_seed(sampling.seed, i, s, stream)) for i in range(n_prompts) for s in range(samples)]


def check_concurrency(concurrency: int) -> int:
    """The concurrency as an int >= 1 (greedy or sampled: `ready.decode.engine` does both)."""
    c = int(concurrency)
    if c < 1:
        raise DecodeError(f"concurrency={concurrency}; expected an integer >= 1 (sequences decoded together)")
    return c


def run_batched(target: Any, drafter: Optional[Drafter], prompts: Sequence[torch.Tensor], max_new_tokens: int,
                concurrency: int, *, eos_token_id: Optional[int] = None, warmup: int = 1, progress: bool = True,
                desc: str = "", cuda_graphs: Optional[bool] = None,
                donors: Optional[Sequence[torch.Tensor]] = None, sampling: Optional[SamplingParams] = None,
                seeds: Optional[Sequence[int]] = None, trace_rounds: int = 0,
                on_finish: Optional[Callable[[int, Generation, list], None]] = None,
                verify_schedule: Optional[VerifySchedule] = None) -> BatchResult:
    """Generations of every prompt through an `Engine` of `concurrency` slots (AR without a drafter),
    greedy or with `sampling` (generation i with seeds[i], its first `trace_rounds` rounds traced), after
    `warmup` untimed passes over the first `concurrency` prompts (sizes the cache for the longest prompt,
    captures the graphs). Each generation's wall_s is its share of the timed pass, so a benchmark's TPS
    is its throughput at that concurrency (`ready.decode.engine`). `donors`: prompt i's drafter reads the
    committed states of donors[i] instead of its own (the state placebo). `on_finish`: see
    `Engine.decode` (timed pass only). `verify_schedule`: the drafter's rounds' (`ready.decode.schedule`)."""
    engine = Engine(target, drafter, batch_size=concurrency, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs,
                    sampling=sampling, verify_schedule=verify_schedule if drafter is not None else None)
    engine.reserve(max(p.numel() for p in prompts) + max_new_tokens)
    for _ in range(warmup):
        engine.decode(prompts[:concurrency], max_new_tokens,
                        donors=None if donors is None else donors[:concurrency],
                        seeds=None if seeds is None else seeds[:concurrency])
    return engine.decode(prompts, max_new_tokens, progress=progress, desc=desc, donors=donors, seeds=seeds,
                           trace_rounds=trace_rounds, on_finish=on_finish)


def run_ar(target: Any, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int, *, eos_token_id: Optional[int] = None,
           warmup: int = 1, progress: bool = True, desc: str = "AR",
           cuda_graphs: Optional[bool] = None, exact: Optional[bool] = None,
           sampling: Optional[SamplingParams] = None, samples: int = 1, stream: str = "",
           concurrency: int = 1) -> list[Generation]:
    """AR generations of every prompt (the lossless reference and the speed baseline): greedy, or with
    `sampling` (temperature > 0) `samples` per prompt, prompt-major (`units`; `stream`: the benchmark).
    `exact`: put the target in (True) or out of (False) exact mode first; None leaves it. `concurrency` > 1
    (greedy or sampled): `concurrency` generations decoded together (`run_batched`)."""
    set_exact(target, exact)
    prompts = [as_prompt(p) for p in prompts]
    for p in prompts:
        check_prompt(target, p, max_new_tokens)
    todo = units(len(prompts), sampling, samples, stream)
    if check_concurrency(concurrency) > 1:
        return run_batched(target, None, [prompts[i] for i, _, _ in todo], max_new_tokens, int(concurrency),
                           eos_token_id=eos_token_id, warmup=warmup, progress=progress, desc=desc,
                           cuda_graphs=cuda_graphs, sampling=sampled(sampling),
                           seeds=None if sampled(sampling) is None else [seed for _, _, seed in todo]).generations
    engine = Engine(target, None, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs, sampling=sampled(sampling))
    if prompts:
        _warm_up(engine, prompts, max_new_tokens, warmup)
    return [engine.generate(prompts[i], max_new_tokens, seed=seed)
            for i, _, seed in tqdm(todo, desc=desc, disable=not progress, leave=False)]


def next_prompt_donors(n: int) -> list[int]:
    """The placebo's pairing: prompt i reads the states of prompt i + 1 (the last reads the first)."""
    if n < 2:
        raise DecodeError(f"the state placebo reads another prompt's states, so it needs at least 2 prompts; got {n} "
                          "(raise bench.limit)")
    return [(i + 1) % n for i in range(n)]


def donor_tokens(prompts: Sequence[torch.Tensor], ar: Sequence[Generation], j: int, samples: int = 1) -> torch.Tensor:
    """Prompt j followed by its AR continuation (the first sample's when sampled, `ar` prompt-major with
    `samples` per prompt): the text whose states a placebo reads."""
    return torch.cat([prompts[j].cpu(), torch.tensor(ar[j * samples].tokens, dtype=torch.long)])


def report_lossless_failure(benchmark: str, method: str, mm: Mismatch, failure: Optional[dict] = None,
                            exact: bool = False) -> None:
    """The loud report: a token beyond the tie margin (`failure`), or any difference in exact mode."""
    msg = (f"LOSSLESS FAILURE on {benchmark} ({method}): prompt {mm.prompt_index}, new token {mm.position}: "
           f"AR greedy gave {mm.expected}, speculative decoding gave {mm.got}.")
    if failure is not None and failure.get("deficit") is not None:
        msg += (f" At new token {failure['position']} the {failure['who']} token {failure['token']} lies "
                f"{failure['deficit']:.4g} below the target's top-1 logit (token {failure['top1']}), beyond the tie "
                f"margin {failure['margin']:.4g}: not greedy, so this is a bug.")
    elif failure is not None:
        msg += f" {failure.get('reason', '')}; this is a bug."
    elif exact:
        msg += (" The target runs in exact mode, where speculative output must equal AR token for token (the "
                "difference is within the tie margin, so the output is still greedy-valid); this is a bug in exact mode.")
    else:
        msg += " Speculative output must equal AR greedy token for token; this is a bug."
    print("!" * 80 + "\n" + msg + "\n" + "!" * 80, file=sys.stderr, flush=True)
    warnings.warn(msg, LosslessWarning, stacklevel=3)


def _summaries(ar: Sequence[Any], spec: Sequence[Any], benchmark: str, method: str, drafter: Optional[Drafter],
               lossless: int) -> tuple[Any, Any]:
    """(the drafting row's metrics with its speedup over AR, AR's metrics) of one benchmark's generations."""
    k = drafter.proposals if drafter is not None else 0
    ar_metrics = summarize([g.log() for g in ar], benchmark, "ar", 0)
    ar_metrics.lossless, ar_metrics.speedup = 1, 1.0
    metrics = summarize([g.log() for g in spec], benchmark, method, k)
    with_ar(metrics, ar_metrics)
    metrics.lossless = lossless
    return metrics, ar_metrics


def evaluate(target: Any, drafter: Optional[Drafter], prompts: Sequence[Sequence[int] | torch.Tensor],
             max_new_tokens: int, *, benchmark: str = "default", method: Optional[str] = None,
             eos_token_id: Optional[int] = None, warmup: int = 1, progress: bool = True,
             ar: Optional[Sequence[Generation]] = None, cuda_graphs: Optional[bool] = None,
             donors: Optional[Sequence[int]] = None, interleave_ar: bool = False, exact: Optional[bool] = None,
             tie_rel: Optional[float] = None, sampling: Optional[SamplingParams] = None, samples: int = 1,
             check_rounds: int = 2, concurrency: int = 1,
             verify_schedule: Optional[VerifySchedule] = None) -> EvalResult:
    """Decode every prompt with `drafter` (AR when None) and with AR, compare them, measure.

    `ar` reuses AR generations of the same prompts (the sweep runner decodes AR once per
    benchmark); `warmup` untimed generations of the first prompt precede each timed pass.
    `donors` (the state placebo): for prompt i, the index of another prompt whose committed
    states the drafter reads instead of its own (that prompt followed by its AR continuation).
    `interleave_ar`: time AR afresh in this process, prompt by prompt alternating with the drafter
    (A B A B ...), so each prompt's speedup compares two timings taken side by side (the CUDA
    default); otherwise the speedup uses the timing stored with `ar`.
    `exact`: put the target in (True) or out of (False) exact mode first (None leaves it; `ar` given
    must come from the same mode). `tie_rel`: the tie margin (default `TIE_REL` of the target's dtype).
    `sampling` (temperature > 0): `samples` generations per prompt with shared seeds (`units`; `ar`, when
    given, must hold them prompt-major), lossless = the distribution check of the first `check_rounds`
    rounds of every generation (module docstring).
    `concurrency` > 1: the drafter's (and, when decoded here, AR's) generations come from a batched engine
    with that many slots (`run_batched`; interleaving then alternates whole passes, AR first), sampled ones
    with their own seeds and distribution check; every generation keeps its own record; with `donors` each
    slot reads its own donor (`ready.decode.engine`).
    `EvalResult.concurrency` records what was used.
    `verify_schedule` (default full): which drafts the drafter's rounds verify (`ready.decode.schedule`);
    `EvalResult.verification` records it with the tokens verified per round and the head's calibration.
    """
    schedule = verify_schedule or VerifySchedule()
    set_exact(target, exact)
    concurrency = check_concurrency(concurrency)
    sampling = sampled(sampling)
    ids = [as_prompt(p) for p in prompts]
    if not ids:
        raise DecodeError(f"benchmark {benchmark!r} has no prompts; expected at least one")
    for p in ids:
        check_prompt(target, p, max_new_tokens)
    method = method or ("ar" if drafter is None else type(drafter).__name__.lower())
    todo = units(len(ids), sampling, samples, benchmark)
    n_samples = len(todo) // len(ids)
    if ar is None:
        ar = run_ar(target, ids, max_new_tokens, eos_token_id=eos_token_id, warmup=warmup, progress=progress,
                    desc=f"{benchmark} AR", cuda_graphs=cuda_graphs, sampling=sampling, samples=n_samples,
                    stream=benchmark, concurrency=concurrency)
    elif len(ar) != len(todo):
        per = "prompt" if sampling is None else f"(prompt, sample): {len(ids)} prompts x {n_samples} samples"
        raise DecodeError(f"got {len(ar)} AR generations for {len(todo)} generations; expected one per {per}")
    if donors is not None and (drafter is None or len(donors) != len(ids)):
        raise DecodeError(f"got {len(donors)} donors for {len(ids)} prompts and drafter {drafter!r}; expected one "
                          "donor prompt index per prompt and a drafter")
    rel = tie_rel_for(target.dtype) if tie_rel is None else float(tie_rel)
    dist: list[DistValidity] = []  # sampled drafting rows: the check of every generation, in `todo` order
    if drafter is None:
        spec = list(ar)
    elif concurrency > 1:
        unit_ids = [ids[i] for i, _, _ in todo]
        seeds = None if sampling is None else [seed for _, _, seed in todo]
        if interleave_ar:  # whole passes side by side: AR timed afresh here, then the drafter
            ar = run_batched(target, None, unit_ids, max_new_tokens, concurrency, eos_token_id=eos_token_id,
                             warmup=warmup, progress=progress, desc=f"{benchmark} AR", cuda_graphs=cuda_graphs,
                             sampling=sampling, seeds=seeds).generations
        checked: dict[int, DistValidity] = {}

        def check(u: int, g: Generation, traces: list) -> None:  # each generation as it ends, off the clock
            checked[u] = check_distribution(target, unit_ids[u], g.tokens, traces, rel, schedule)

        batched = run_batched(target, drafter, unit_ids, max_new_tokens, concurrency, eos_token_id=eos_token_id,
                              warmup=warmup, progress=progress,
                              desc=f"{benchmark} {method}" + (" (donor states)" if donors else ""),
                              cuda_graphs=cuda_graphs, sampling=sampling, seeds=seeds,
                              trace_rounds=int(check_rounds) if sampling is not None else 0,
                              on_finish=check if sampling is not None else None,
                              donors=None if donors is None else [donor_tokens(ids, ar, donors[i], n_samples)
                                                                   for i, _, _ in todo],
                              verify_schedule=schedule)
        spec = batched.generations
        if sampling is not None:
            dist = [checked[u] for u in range(len(todo))]
    else:
        engine = Engine(target, drafter, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs, sampling=sampling,
                        verify_schedule=schedule)
        _warm_up(engine, ids, max_new_tokens, warmup,
                 donor=None if donors is None else donor_tokens(ids, ar, donors[0], n_samples))
        desc = f"{benchmark} {method}" + (" (donor states)" if donors is not None else "")
        ar_engine = None
        if interleave_ar:
            ar_engine = Engine(target, None, eos_token_id=eos_token_id, cuda_graphs=cuda_graphs, sampling=sampling)
            _warm_up(ar_engine, ids, max_new_tokens, warmup)
        spec, timed = [], []
        trace = int(check_rounds) if sampling is not None else 0
        for i, _s, seed in tqdm(todo, desc=desc, disable=not progress, leave=False):
            p = ids[i]
            if ar_engine is not None:
                timed.append(ar_engine.generate(p, max_new_tokens, seed=seed))
            spec.append(engine.generate(p, max_new_tokens, seed=seed, trace_rounds=trace,
                                        donor=None if donors is None else donor_tokens(ids, ar, donors[i], n_samples)))
            if sampling is not None:  # checked now, off the clock, so the traces need not be kept
                dist.append(check_distribution(target, p, spec[-1].tokens, engine.traces, rel, schedule))
        if ar_engine is not None:  # the same tokens as `ar` (lossless is checked against those), timed here
            ar = timed
    if sampling is not None:
        res = _sampled_result(benchmark, method, drafter, ids, todo, ar, spec, dist, donors, sampling, concurrency)
        res.verification = _verification(drafter, spec, schedule)
        return res

    exact_mode = bool(getattr(target, "exact", False))
    results, mismatch, loud, checks = [], None, None, []
    for i, (a, s) in enumerate(zip(ar, spec)):
        mm = first_mismatch(a.tokens, s.tokens)
        v = check_greedy(target, ids[i], a.tokens, s.tokens, tie_rel) if mm is not None else Validity(1, 1, 0)
        checks.append(v)
        if mm is not None:
            here = Mismatch(prompt_index=i, position=mm[0], expected=mm[1], got=mm[2])
            mismatch = mismatch or here
            if loud is None and (not v.greedy_valid or exact_mode):
                loud = (here, v.failure)
        results.append(PromptResult(index=i, prompt_len=s.prompt_len, tokens=s.tokens, accepted=s.accepted,
                                    horizons=s.horizons, wall_s=s.wall_s, ar_wall_s=a.wall_s, lossless=v.greedy_valid,
                                    committed=list(s.committed), donor=None if donors is None else int(donors[i]),
                                    lossless_exact=v.lossless_exact, greedy_valid=v.greedy_valid,
                                    tie_flips=v.tie_flips, min_margin=v.min_margin, noise_floor=v.noise_floor,
                                    verified=list(s.verified), confidence=[list(c) for c in s.confidence]))
    greedy_valid = int(all(v.greedy_valid for v in checks))
    lossless_exact = int(all(v.lossless_exact for v in checks))
    tie_flips = sum(v.tie_flips for v in checks)
    margins = [v.min_margin for v in checks if v.min_margin is not None]
    if loud is not None:
        report_lossless_failure(benchmark, method, loud[0], loud[1], exact_mode)
    elif mismatch is not None:
        print(f"note ({benchmark}, {method}): greedy-valid with {tie_flips} tie flip(s) within the margin, not "
              f"identical to AR (first at prompt {mismatch.prompt_index}, new token {mismatch.position}; smallest "
              f"margin {min(margins):.4g}); expected in 16-bit fast mode, see docs/sweeps.md", file=sys.stderr)
    lossless = greedy_valid

    metrics, ar_metrics = _summaries(ar, spec, benchmark, method, drafter, lossless)
    return EvalResult(benchmark=benchmark, method=method, metrics=metrics, ar=ar_metrics, lossless=lossless,
                      mismatch=mismatch, prompts=results, lossless_exact=lossless_exact, greedy_valid=greedy_valid,
                      tie_flips=tie_flips, min_margin=min(margins) if margins else None, exact=exact_mode,
                      concurrency=concurrency, verification=_verification(drafter, spec, schedule))


def schedule_record(schedule: VerifySchedule) -> dict[str, Any]:
    """A schedule as evaluation.json names it (the `eval` keys that chose it)."""
    out: dict[str, Any] = {"verify_schedule": schedule.kind}
    if schedule.scheduled:
        out.update(confidence_threshold=schedule.threshold, verify_budget=schedule.budget)
    return out


def pooled_verification(results: Sequence[EvalResult]) -> Optional[dict[str, Any]]:
    """The verification record of several benchmarks' results pooled (`overall`): every prompt's rounds
    as one sample; None when none of them drafted."""
    drafting = [r for r in results if r.verification is not None]
    if not drafting:
        return None
    k = drafting[0].metrics.proposals
    schedule = {key: v for key, v in drafting[0].verification.items()
                if key in ("verify_schedule", "confidence_threshold", "verify_budget")}
    return verification_summary([p for r in drafting for p in r.prompts], k, schedule)


def _verification(drafter: Optional[Drafter], spec: Sequence[Generation],
                  schedule: VerifySchedule) -> Optional[dict[str, Any]]:
    """A drafting row's verification record (`ready.calibration.verification_summary`); None for AR."""
    if drafter is None:
        return None
    return verification_summary(spec, drafter.proposals, schedule_record(schedule))


def report_distribution_failure(benchmark: str, method: str, index: int, sample: int, failure: dict) -> None:
    """The loud report of a sampled generation that failed the distribution check."""
    msg = (f"LOSSLESS FAILURE on {benchmark} ({method}, sampled): prompt {index}, sample {sample}: the "
           f"{failure.get('check')} check failed ({failure}); the output is not distributed as the target's "
           "sampling (ready/decode/dist_check.py); this is a bug.")
    print("!" * 80 + "\n" + msg + "\n" + "!" * 80, file=sys.stderr, flush=True)
    warnings.warn(msg, LosslessWarning, stacklevel=3)


def _sampled_result(benchmark: str, method: str, drafter: Optional[Drafter], ids: Sequence[torch.Tensor],
                    todo: Sequence[tuple[int, int, Optional[int]]], ar: Sequence[Generation],
                    spec: Sequence[Generation], dist: Sequence[DistValidity], donors: Optional[Sequence[int]],
                    sampling: SamplingParams, concurrency: int = 1) -> EvalResult:
    """The EvalResult of a sampled evaluation: one record per (prompt, sample), lossless = dist_valid."""
    results, loud = [], None
    for u, ((i, s, seed), a, g) in enumerate(zip(todo, ar, spec)):
        v = dist[u] if dist else DistValidity(dist_valid=1, rounds=0)  # AR sampling is the definition
        if not v.dist_valid and loud is None:
            loud = (i, s, v.failure)
        results.append(PromptResult(index=i, prompt_len=g.prompt_len, tokens=g.tokens, accepted=g.accepted,
                                    horizons=g.horizons, wall_s=g.wall_s, ar_wall_s=a.wall_s, lossless=v.dist_valid,
                                    committed=list(g.committed), donor=None if donors is None else int(donors[i]),
                                    lossless_exact=None, greedy_valid=None, sample=s, seed=seed,
                                    dist_valid=v.dist_valid, dist_rounds=v.rounds, rule_err=v.rule_err,
                                    state_err=v.state_err, verified=list(g.verified),
                                    confidence=[list(c) for c in g.confidence]))
    if loud is not None:
        report_distribution_failure(benchmark, method, *loud)
    lossless = int(all(r.lossless for r in results))
    metrics, ar_metrics = _summaries(ar, spec, benchmark, method, drafter, lossless)
    info = {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
            "samples": len(todo) // max(1, len(ids))}
    return EvalResult(benchmark=benchmark, method=method, metrics=metrics, ar=ar_metrics, lossless=lossless,
                      mismatch=None, prompts=results, lossless_exact=None, greedy_valid=None, sampling=info,
                      dist_valid=lossless, dist_rounds=sum(v.rounds for v in dist),
                      rule_err=max((v.rule_err for v in dist), default=None),
                      state_err=max((v.state_err for v in dist), default=None), concurrency=concurrency)
