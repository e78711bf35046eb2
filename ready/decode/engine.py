"""Greedy decoding engine: autoregressive and block speculative decoding over the hybrid target.

One speculative round (batch 1, the paper's setting):

1. the drafter proposes K tokens d_1..d_K after the last committed token x;
2. one target forward verifies the block [x, d_1..d_K] and gives K+1 greedy argmaxes p_0..p_K
   (each verified token's GDN inputs go to `cache.pending_*`, the live state is untouched);
3. A = the longest prefix with d_j == p_{j-1}; the round appends d_1..d_A and the target's
   correction p_A (the bonus token when A = K): exactly the next A+1 tokens that greedy
   autoregressive decoding would produce, so the output is lossless by construction;
4. `target.commit(cache, A+1)` replays x, d_1..d_A onto the live states: rejected drafts leave no
   trace in the GDN states or the attention KV.

The token budget and EOS truncate the appended tokens; the round's horizon h (draft positions
that could still be observed, see `ready.metrics`) is min(K, tokens left, position of the first
accepted EOS draft), and A is capped at h; drafts past the budget are not even verified (the
block is shortened in the last round), so the cache never holds more than prompt + budget
tokens. Timing follows `ready.metrics`: the clock covers
prefill through the last token, with a device synchronisation at both ends on CUDA.

The state placebo (`generate(..., donor=ids)`): the drafter's reader is handed the committed
states of another sequence instead of this one's. Before the clock starts, one forward pass of the
donor (another prompt followed by its AR continuation) gives its states after as many tokens as
this sequence will have committed in each round (or all of the donor's, when it is shorter;
`ready.decode.donor`, kept per process); each round copies the ones due into a second cache that
the drafter reads: the reader sees another text's states at the same position. Verification, and
so the output, is untouched, and the copies are left out of the generation's wall time.

On CUDA (default there), `Engine(cuda_graphs=True)` replays the fixed-shape verify ([1, K+1])
and AR step ([1, 1]) forwards from captured CUDA graphs (`ready.decode.graphs`); prefill,
drafting and the bookkeeping run eagerly. On CPU everything runs eagerly (cuda_graphs=True
there runs the graphs' static-cache path without capturing, for tests).

Exact mode (`target.exact`, read when the engine is built): verify and the AR step run the
target's row-invariant ops, so the speculative output equals AR token for token in any dtype. With
graphs, the shortened last round is then padded to K+1 tokens (copies of its last token, never
committed; every engine's cache has EXACT_PAD spare positions, so AR and speculative caches
have one length) and replayed from the same graph, because the
eager verify would not run the compiled layers the graphs run.

Sampling (`Engine(sampling=SamplingParams(temperature > 0, top_p, seed))`, `ready.decode.sampling`):
AR draws each token from the warped target distribution p; a speculative round draws the block
from the drafter's q position by position (`drafter.sample`, conditioned on the previously sampled
token; a drafter without `sample` is deterministic, q a point mass), then accepts draft j with
probability min(1, p_j(d_j)/q_j(d_j)), draws the correction from normalise(max(0, p_A - q_A)) at the
first rejection, or the bonus from p_K after a full block. The output is distributed exactly as
AR sampling; commit, horizons and censoring are the greedy ones. One CPU generator per generation
(`generate(..., seed=)`) supplies the uniforms: K for the drafts, K for the acceptances and one for
the next token per round (one per AR step), the same count whatever happens, so rows that decode
the same (prompt, seed) share their random numbers. Temperature 0 is the greedy path, unchanged.
`generate(..., trace_rounds=R)` keeps the first R rounds' p, q and drafts (`engine.traces`) for
the evaluation's distribution check (`ready.decode.dist_check`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from ready.decode.donor import donor_states, read_lengths
from ready.decode.errors import DecodeError
from ready.decode.graphs import GraphRunner
from ready.decode.protocol import DraftStep, Drafter, describe
from ready.decode.sampling import DraftSampling, SamplingParams, draw, point_mass, speculative_round, warp
from ready.metrics import SequenceLog
from ready.target.config import EMBEDDINGS

# an acceptance rule: (drafts [K], target argmaxes [K+1]) -> accepted count A in 0..K
EXACT_PAD = 15  # exact mode, graphs: spare cache positions of every engine (>= K of any drafter: K + 1 <= 16)
AcceptFn = Callable[[torch.Tensor, torch.Tensor], int]


@dataclass
class Generation:
    """The outcome of decoding one prompt."""

    prompt_len: int
    tokens: list[int]  # new tokens (first one from the prefill)
    proposals: int  # K (0 for autoregressive decoding)
    accepted: list[int] = field(default_factory=list)  # A_i per round (AR: one 0 per step)
    horizons: list[int] = field(default_factory=list)  # h_i per round
    committed: list[int] = field(default_factory=list)  # tokens appended per round (A_i + 1, less at the budget or EOS)
    wall_s: float = 0.0  # prefill .. last token
    prefill_s: float = 0.0
    stop: str = "budget"  # "budget" | "eos"

    def log(self) -> SequenceLog:
        return SequenceLog(
            new_tokens=len(self.tokens), wall_s=self.wall_s, accepted=list(self.accepted),
            horizons=list(self.horizons), prefill_s=self.prefill_s, committed=list(self.committed),
        )

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


@dataclass
class RoundTrace:
    """One sampled round as the acceptance rule saw it (device tensors, for `ready.decode.dist_check`)."""

    start: int  # committed tokens before the round (the block's first token is tokens[start - 1])
    drafts: list[int]  # the k verified drafts
    logits: torch.Tensor  # [k+1, V] target logits of the verify (the target's dtype)
    p: torch.Tensor  # [k+1, V] warped target distribution
    q: torch.Tensor  # [k, V] the drafter's distribution the drafts were drawn from
    accepted: int  # A (raw, before the horizon cap)


def greedy_accept(drafts: torch.Tensor, argmax: torch.Tensor) -> int:
    """Length of the longest prefix of `drafts` [K] equal to the target argmaxes `argmax[:K]`."""
    k = drafts.shape[-1]
    match = (drafts == argmax[:k]).to(torch.int32)
    return int(match.cumprod(0).sum())


@dataclass
class RoundOutcome:
    accepted: int  # A, capped at the horizon
    horizon: int  # h
    tokens: list[int]  # tokens appended to the sequence this round
    commit: int  # verified tokens whose states the cache keeps (A + 1)
    eos: bool  # the sequence ended with EOS


def settle_round(drafts: list[int], argmax: list[int], accepted: int, remaining: int,
                 eos_token_id: Optional[int]) -> RoundOutcome:
    """Turn one verification into appended tokens, the horizon and the capped A.

    `drafts` [K], `argmax` [K+1] (target greedy tokens after each verified token), `accepted`
    the raw accepted count, `remaining` the token budget left (>= 1).
    """
    k = len(drafts)
    horizon = min(k, remaining)
    if eos_token_id is not None:
        for j in range(1, accepted + 1):  # an accepted EOS draft ends the sequence at position j
            if drafts[j - 1] == eos_token_id:
                horizon = min(horizon, j)
                break
    a = min(accepted, horizon)
    tokens = (drafts[:a] + [argmax[a]])[:remaining]
    eos = False
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
        eos = True
    return RoundOutcome(accepted=a, horizon=horizon, tokens=tokens, commit=a + 1, eos=eos)


def pick(logits: torch.Tensor, sampling: Optional[SamplingParams], gen: Optional[torch.Generator]) -> torch.Tensor:
    """The next token from logits [V]: argmax (greedy, `sampling` None), or a draw from the warped
    distribution with the next uniform of `gen` (the generation's CPU generator)."""
    if sampling is None:
        return logits.argmax(-1)
    probs = warp(logits, sampling.temperature, sampling.top_p)
    return draw(probs, torch.rand(1, generator=gen, dtype=torch.float32)[0].to(probs.device))


def sampled_draft(drafter: Drafter, step: DraftStep, sampling: SamplingParams, u: torch.Tensor,
                  vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K sampled drafts [1, K] of one sequence with its uniforms u [K] (on the device), and the
    distribution q [K, V] they were drawn from (a point mass for a drafter without `sample`)."""
    k = u.shape[0]
    sample = getattr(drafter, "sample", None)
    if sample is None:
        drafts = _check_drafts(drafter.propose(step), k, vocab, drafter)
        return drafts, point_mass(drafts[0].to(u.device), vocab)
    drafts, q = sample(step, DraftSampling(sampling.temperature, sampling.top_p, u[None]))
    drafts = _check_drafts(drafts, k, vocab, drafter)
    if not isinstance(q, torch.Tensor) or tuple(q.shape) != (1, k, vocab):
        got = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise DecodeError(f"drafter {describe(drafter)} sampled with a distribution of shape {got}; "
                          f"expected probabilities of shape (1, {k}, {vocab})")
    return drafts, q[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def target_device(target: Any) -> torch.device:
    return next(target.parameters()).device


def as_prompt(prompt: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """A prompt as a 1-D LongTensor (a [1, P] tensor is accepted too)."""
    ids = prompt if isinstance(prompt, torch.Tensor) else torch.tensor(list(prompt), dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise DecodeError(f"prompt has shape {tuple(ids.shape)}; expected a 1-D list of token ids (batch 1)")
    return ids.long()


def check_prompt(target: Any, prompt: torch.Tensor, max_new_tokens: int) -> None:
    """Raise DecodeError for an empty prompt, ids outside the vocabulary or too long a sequence."""
    cfg = target.config
    if prompt.numel() == 0:
        raise DecodeError("prompt is empty; expected at least one token id")
    if max_new_tokens < 1:
        raise DecodeError(f"max_new_tokens={max_new_tokens}; expected an integer >= 1")
    lo, hi = int(prompt.min()), int(prompt.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise DecodeError(f"prompt holds token id {lo if lo < 0 else hi}; expected ids in 0..{cfg.vocab_size - 1}")
    ctx = int(cfg.max_position_embeddings)
    if prompt.numel() + max_new_tokens > ctx:
        raise DecodeError(
            f"prompt of {prompt.numel()} tokens + max_new_tokens {max_new_tokens} exceeds the model's context of "
            f"{ctx} tokens (config.max_position_embeddings); shorten the prompt or lower max_new_tokens"
        )


def check_drafter(target: Any, drafter: Drafter) -> None:
    """Raise DecodeError if the drafter cannot work with this target."""
    k = getattr(drafter, "proposals", None)
    if not isinstance(k, int) or k < 1:
        raise DecodeError(f"drafter {describe(drafter)} proposes K={k!r} tokens per round; expected an integer >= 1")
    vocab = getattr(drafter, "vocab_size", None)
    if vocab != target.config.vocab_size:
        raise DecodeError(
            f"drafter {describe(drafter)} has vocabulary size {vocab}; expected the target's {target.config.vocab_size}"
        )
    n_layers = target.config.num_hidden_layers
    bad = [i for i in getattr(drafter, "capture_layers", []) if not EMBEDDINGS <= i < n_layers]
    if bad:
        raise DecodeError(f"drafter {describe(drafter)} asks for target layers {bad}; expected ids in 0..{n_layers - 1} "
                          f"(or {EMBEDDINGS} for the token embeddings)")


def _check_drafts(drafts: Any, k: int, vocab: int, drafter: Drafter) -> torch.Tensor:
    if not isinstance(drafts, torch.Tensor) or tuple(drafts.shape) != (1, k) or drafts.dtype != torch.long:
        got = (tuple(drafts.shape), drafts.dtype) if isinstance(drafts, torch.Tensor) else type(drafts).__name__
        raise DecodeError(f"drafter {describe(drafter)} proposed {got}; expected a LongTensor of shape (1, {k})")
    lo, hi = (int(v) for v in torch.stack([drafts.min(), drafts.max()]).tolist())
    if lo < 0 or hi >= vocab:
        raise DecodeError(f"drafter {describe(drafter)} proposed token id {lo if lo < 0 else hi}; expected ids in 0..{vocab - 1}")
    return drafts


class Engine:
    """Decodes prompts one at a time with one target (and optionally one drafter), reusing
    one static cache and token/feature buffers across prompts."""

    def __init__(self, target: Any, drafter: Optional[Drafter] = None, *, eos_token_id: Optional[int] = None,
                 cuda_graphs: Optional[bool] = None, accept_fn: Optional[AcceptFn] = None,
                 sampling: Optional[SamplingParams] = None) -> None:
        """`eos_token_id` defaults to `target.config.eos_token_id`. `cuda_graphs` (default: on
        CUDA) replays captured verify/step graphs. `accept_fn` replaces greedy matching (only
        for engine benchmarks that force acceptance lengths: the output is then not lossless).
        `sampling` with temperature > 0 samples (module docstring); None or temperature 0 is greedy."""
        if drafter is not None:
            check_drafter(target, drafter)
        self.sampling = None if sampling is None or sampling.greedy else sampling
        if self.sampling is not None and accept_fn is not None:
            raise DecodeError("accept_fn forces greedy acceptance lengths; it cannot be combined with sampling "
                              "(temperature > 0)")
        self._gen: Optional[torch.Generator] = None  # this generation's uniforms (sampling)
        self._trace_rounds = 0
        self.traces: list[RoundTrace] = []  # the first rounds of the last generation, when asked
        self.target = target
        self.drafter = drafter
        self.k = drafter.proposals if drafter is not None else 0
        self.capture = list(getattr(drafter, "capture_layers", []) or []) if drafter is not None else []
        self.eos = target.config.eos_token_id if eos_token_id is None else eos_token_id
        self.device = target_device(target)
        self.accept_fn = accept_fn or greedy_accept
        self.exact = bool(getattr(target, "exact", False))
        self.cache: Any = None
        self.donor_cache: Any = None  # the placebo's second cache (see the module docstring)
        self._donor: Optional[torch.Tensor] = None  # the donor's states at each length this generation reads
        self._donor_s = 0.0  # time spent copying donor states this generation (not counted in wall_s)
        self.tokens: Optional[torch.Tensor] = None  # [1, max_len] committed tokens
        self.features: Optional[torch.Tensor] = None  # [1, max_len, C, D] target features
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.graphs = None
        if use_graphs:  # on CPU this runs the same static-cache path eagerly (tests)

            self.graphs = GraphRunner(target, self.capture)

    # --- buffers ---------------------------------------------------------------------
    def reserve(self, max_len: int) -> None:
        """Size the cache and buffers for sequences of up to `max_len` tokens (prompt + new)."""
        self._prepare(max_len + self._pad_room(max_len))

    def _prepare(self, need: int) -> None:
        """Allocate (or reuse and reset) a cache and buffers for `need` positions."""
        if self.cache is None or self.cache.max_len < need:
            self.cache = self.target.new_cache(batch_size=1, max_len=need, max_verify=self.k + 1)
            self.tokens = torch.zeros(1, need, dtype=torch.long, device=self.device)
            self.features = None
        else:
            self.cache.reset()
        if self.graphs is not None:
            self.graphs.prepare(self.cache)  # static cache mode from the prefill on

    def _store_features(self, start: int, hidden: Optional[torch.Tensor]) -> None:
        if not self.capture:
            return
        if hidden is None:
            raise RuntimeError("target returned no hidden features although capture_layers were requested")
        if self.features is None:
            shape = (1, self.tokens.shape[1]) + tuple(hidden.shape[2:])
            self.features = torch.zeros(shape, dtype=hidden.dtype, device=hidden.device)
        self.features[:, start:start + hidden.shape[1]] = hidden

    # --- forwards (eager, or replayed from CUDA graphs) -------------------------------
    def _pad_room(self, need: int) -> int:
        """Spare cache positions in exact mode with graphs: room for the padded last round, and the same
        for every engine (AR too), so that the AR and the speculative engines' static caches have the
        same length: attention over a static cache reads the whole buffer, and its reduction may be
        split by the buffer's length (0 without exact mode or graphs, or without room)."""
        if not (self.exact and self.graphs is not None):
            return 0
        return max(0, min(EXACT_PAD, int(self.target.config.max_position_embeddings) - need))

    def _verify(self, block: torch.Tensor) -> Any:
        t = block.shape[1]
        if self.graphs is not None and t == self.k + 1:
            return self.graphs.verify(block, self.cache)
        if (self.graphs is not None and self.exact and t < self.k + 1
                and self.cache.length + self.k + 1 <= self.cache.max_len):
            # exact mode: the shortened last round through the K+1 graph, padded (rows past t unused,
            # uncommitted; causal, so they change nothing in rows < t)
            padded = torch.cat([block, block[:, -1:].expand(block.shape[0], self.k + 1 - t)], dim=1)
            out = self.graphs.verify(padded, self.cache)
            return type(out)(logits=out.logits[:, :t], hidden=None if out.hidden is None else out.hidden[:, :t])
        return self.target.verify(block, self.cache, capture_layers=self.capture)  # the last, shortened round

    def _step(self, tok: torch.Tensor) -> Any:
        if self.graphs is not None:
            return self.graphs.step(tok, self.cache)
        return self.target.step(tok, self.cache)

    # --- decoding -----------------------------------------------------------------------
    # --- the state placebo's donor cache ---------------------------------------------
    def _start_donor(self, donor: Optional[Sequence[int] | torch.Tensor], p: int, max_new_tokens: int) -> None:
        """The donor's states at every length this generation can read them (`ready.decode.donor`), and
        the batch-1 cache the drafter reads them from (so its draft graph stays bound to one cache)."""
        self._donor = None
        if donor is None:
            return
        if self.drafter is None:
            raise DecodeError("a donor sequence only matters to a drafter that reads states; this engine has none")
        layers = list(getattr(self.drafter, "state_layers", self.target.gdn_layer_ids))  # any drafter: every GDN layer
        if not layers:  # reads no state: the donor changes nothing
            return
        ids = as_prompt(donor).to(self.device)
        check_prompt(self.target, ids, 1)
        lengths = read_lengths(p, max_new_tokens, ids.numel())
        if self.donor_cache is None or self.donor_cache.max_len < p + max_new_tokens:
            self.donor_cache = self.target.new_cache(batch_size=1, max_len=p + max_new_tokens, max_verify=self.k + 1)
        else:
            self.donor_cache.reset()
        # before generate starts its clock; the copies in each round are taken off it (see generate)
        self._donor = donor_states(self.target, ids, lengths, layers)
        self._donor_first, self._donor_at, self._donor_s = p, -1, 0.0
        self._donor_lengths = lengths
        self._donor_slots = [self.target.gdn_index(int(i)) for i in layers]

    def _donor_cache(self, committed: int) -> Any:
        """The donor's states after min(committed, donor length) of its tokens in the donor cache (this
        row's cache without a donor)."""
        if self._donor is None:
            return self.cache
        at = max(0, min(committed - self._donor_first, self._donor.shape[0] - 1))
        if at != self._donor_at:
            _sync(self.device)
            t0 = time.perf_counter()
            for j, slot in enumerate(self._donor_slots):
                self.donor_cache.ssm[slot, 0].copy_(self._donor[at, j])
            self.donor_cache.length = self._donor_lengths[at]  # its GDN states only: KV and conv stay unfilled
            _sync(self.device)
            self._donor_s += time.perf_counter() - t0
            self._donor_at = at
        return self.donor_cache

    def _uniforms(self, n: int) -> torch.Tensor:
        """n uniforms in [0, 1) from this generation's generator (float32, CPU)."""
        return torch.rand(n, generator=self._gen, dtype=torch.float32)

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        return pick(logits, self.sampling, self._gen)

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int,
                 donor: Optional[Sequence[int] | torch.Tensor] = None, seed: Optional[int] = None,
                 trace_rounds: int = 0) -> Generation:
        """Decode up to `max_new_tokens` new tokens (speculatively if a drafter is set): greedily, or
        sampled when the engine samples.

        `donor` (the state placebo): another sequence whose committed states the drafter reads
        in place of this one's, position for position; the output is unchanged (verification is
        the target's own), only the drafts and so the acceptance can differ. `seed` (sampling):
        this generation's random numbers (default the params' seed). `trace_rounds` (sampling,
        speculative): keep the first that-many rounds in `self.traces`."""
        self.traces, self._trace_rounds = [], int(trace_rounds)
        if self.sampling is not None:
            self._gen = torch.Generator().manual_seed(int(self.sampling.seed if seed is None else seed))
        ids = as_prompt(prompt)
        check_prompt(self.target, ids, max_new_tokens)
        p = ids.numel()
        # a round never verifies past the budget (see below); exact mode pads the last one (_verify)
        self._prepare(p + max_new_tokens + self._pad_room(p + max_new_tokens))
        self._start_donor(donor, p, max_new_tokens)
        ids = ids.to(self.device)
        self.tokens[0, :p] = ids
        if self.drafter is not None:
            self.drafter.begin(ids[None])
        _sync(self.device)
        t0 = time.perf_counter()
        out = self.target.prefill(ids[None], self.cache, capture_layers=self.capture)
        first = int(self._pick(out.logits[0, -1]))
        self._store_features(0, out.hidden)
        self.tokens[0, p] = first
        _sync(self.device)
        prefill_s = time.perf_counter() - t0
        gen = Generation(prompt_len=p, tokens=[first], proposals=self.k, prefill_s=prefill_s)
        if first == self.eos:
            gen.stop = "eos"
        elif self.drafter is None:
            self._ar_loop(gen, max_new_tokens)
        else:
            self._speculative_loop(gen, max_new_tokens)
        _sync(self.device)
        gen.wall_s = time.perf_counter() - t0 - (self._donor_s if self._donor is not None else 0.0)
        return gen

    def _ar_loop(self, gen: Generation, budget: int) -> None:
        last = self.tokens[:, gen.prompt_len:gen.prompt_len + 1]
        while len(gen.tokens) < budget:
            out = self._step(last)
            if self.sampling is None:
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            else:
                nxt = self._pick(out.logits[0, -1]).view(1, 1)
            tok = int(nxt)
            gen.tokens.append(tok)
            gen.accepted.append(0)
            gen.horizons.append(0)
            gen.committed.append(1)
            if tok == self.eos:
                gen.stop = "eos"
                return
            last = nxt

    def _speculative_loop(self, gen: Generation, budget: int) -> None:
        k, vocab = self.k, self.target.config.vocab_size
        t = gen.prompt_len + 1  # committed tokens (the cache holds the first t - 1)
        while len(gen.tokens) < budget:
            step = DraftStep(
                tokens=self.tokens[:, :t],
                features=self.features[:, : t - 1] if self.capture else None,
                target=self.target,
                cache=self._donor_cache(t - 1),
            )
            # drafts past the budget can never be committed: verify at most `remaining` of them,
            # so the sequence (and the cache) never grows past prompt + max_new_tokens
            remaining = budget - len(gen.tokens)
            if self.sampling is not None:
                out, drafted_l, nexts, raw = self._sampled_round(step, t, remaining)
                res = settle_round(drafted_l, nexts, raw, remaining, self.eos)
            else:
                drafts = _check_drafts(self.drafter.propose(step), k, vocab, self.drafter)
                block = torch.cat([self.tokens[:, t - 1:t], drafts[:, : min(k, remaining)].to(self.device)], dim=1)
                out = self._verify(block)
                # one device->host copy of drafts and argmaxes per round; the rest is host bookkeeping
                both = torch.cat([block[0, 1:], out.logits[0].argmax(-1)]).cpu()
                drafted, argmax = both[: block.shape[1] - 1], both[block.shape[1] - 1:]
                raw = min(self.accept_fn(drafted, argmax), block.shape[1] - 1)
                res = settle_round(drafted.tolist(), argmax.tolist(), raw, remaining, self.eos)
            self.target.commit(self.cache, res.commit)
            if self.capture:
                self._store_features(t - 1, out.hidden[:, : res.commit])
            n = len(res.tokens)
            self.tokens[0, t:t + n] = torch.tensor(res.tokens, dtype=torch.long, device=self.device)
            t += n
            gen.tokens.extend(res.tokens)
            gen.accepted.append(res.accepted)
            gen.horizons.append(res.horizon)
            gen.committed.append(n)
            if res.eos:
                gen.stop = "eos"
                return

    def _sample_drafts(self, step: DraftStep) -> tuple[torch.Tensor, torch.Tensor]:
        """K drafts [1, K] and the distribution q [K, V] they were drawn from (a point mass for a
        drafter without `sample`); K uniforms are drawn either way."""
        k, vocab = self.k, self.target.config.vocab_size
        return sampled_draft(self.drafter, step, self.sampling, self._uniforms(k).to(self.device), vocab)

    def _sampled_round(self, step: DraftStep, t: int, remaining: int) -> tuple[Any, list[int], list[int], int]:
        """Draft, verify and judge one block under the speculative sampling rule: (verify output,
        verified drafts, the next-token list for `settle_round` (only index A is set), raw A)."""
        k = self.k
        drafts, q = self._sample_drafts(step)
        n = min(k, remaining)
        block = torch.cat([self.tokens[:, t - 1:t], drafts[:, :n].to(self.device)], dim=1)
        out = self._verify(block)
        u = self._uniforms(k + 1).to(self.device)
        p = warp(out.logits[0], self.sampling.temperature, self.sampling.top_p)
        n_acc, nxt = speculative_round(p, q[:n], block[0, 1:], u[:n], u[k])
        # one device->host copy per round, as in greedy
        both = torch.cat([block[0, 1:], n_acc[None], nxt[None]]).cpu().tolist()
        drafted, raw, tok = both[:n], int(both[n]), int(both[n + 1])
        nexts = [-1] * (n + 1)  # settle_round reads index A only (a shorter A ends in an accepted EOS)
        nexts[raw] = tok
        if len(self.traces) < self._trace_rounds:
            self.traces.append(RoundTrace(start=t, drafts=drafted, logits=out.logits[0].clone(), p=p, q=q[:n].clone(),
                                          accepted=raw))
        return out, drafted, nexts, raw


def generate(target: Any, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int,
             drafter: Optional[Drafter] = None, eos_token_id: Optional[int] = None,
             donor: Optional[Sequence[int] | torch.Tensor] = None, sampling: Optional[SamplingParams] = None,
             seed: Optional[int] = None) -> Generation:
    """One-off generation (AR without a drafter, speculative with one): greedy, or sampled with `sampling`."""
    return Engine(target, drafter, eos_token_id=eos_token_id, sampling=sampling).generate(
        prompt, max_new_tokens, donor=donor, seed=seed)
