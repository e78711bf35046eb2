"""Batched decoding: B sequences at once, autoregressive or speculative, with ragged acceptance; greedy,
or sampled at temperature > 0.

`BatchEngine(target, drafter, batch_size=B).generate(prompts, max_new_tokens)` decodes any number of
prompts through B slots (continuous batching: a slot whose sequence ended takes the next prompt).
Every round runs one target forward over all B slots:

1. drafting (speculative): the DSpark / ReaDy drafter proposes K tokens for every slot in one
   batched draft step (`BatchDraft`: each row's context length, rotary positions, context mask
   and reader slot are its own); another drafter (n-gram) is asked row by row;
2. one ragged verify of the [B, K+1] block (`ready.target.ragged`): row b sits at its own
   committed length, attention reads a shared padded KV buffer through a per-row mask;
3. each row is settled exactly as the single-sequence engine settles it (`settle_round`: its own
   token budget, horizon, accepted EOS), so its tokens, accepted lengths, horizons and committed
   counts equal a batch-1 generation's;
4. one commit with a per-row count (the GDN commit kernel takes one), and per-row lengths advance
   by what each row committed. A slot with nothing to decode (its sequence ended, no prompt left)
   is still computed (fixed shapes) but commits nothing to its length and appends nothing.

A row never verifies fewer than K drafts (the block is one tensor); drafts past a row's budget are
verified but ignored by `settle_round`, exactly as if the block had been shortened (greedy
argmaxes are causal: position j's argmax does not depend on later positions). The cache keeps
K+1 spare positions per row for them (past the target's context too: they are never committed).

Timing: one clock for the whole call (a device synchronisation at both ends on CUDA). Every span is
charged to the rows it served: a prefill to its row, a round in equal shares to the rows still
decoding in it. So each generation's `wall_s` is its share of the clock, the shares add up to the
call's wall time, and a benchmark's TPS (sum of new tokens / sum of wall times, `ready.metrics`)
is the throughput at concurrency B: total committed tokens / wall time. `prefill_s` is the row's
own prefill.

Exact mode (`target.exact`): the verify runs the target's row-invariant ops (`ready.target.ragged`),
so every row's tokens equal the single-sequence engine's in any dtype, not only within ties.

Donors (the state placebo, the state swap): `generate(..., donors=...)` gives prompt i another text
whose committed states the drafter reads in place of its own, as `Engine.generate(donor=...)` does: in
the round after c committed tokens, the donor's states after min(c, donor length) of its tokens
(`ready.decode.donor`). They are copied into a donor state buffer shaped like the cache's, which the
batched draft step reads instead of the cache; verification stays the target's own, so the output is
unchanged. The copies are taken off the clock.

Sampling (`sampling` with temperature > 0): each row runs the single-sequence engine's rule with its own
random numbers: a CPU generator per generation, seeded by `generate(..., seeds=...)` (default the
params' seed), drawn in the order `Engine` draws them (1 for the prefill's token; per round K for the
drafts, then K + 1 for the acceptance; 1 per AR step). The batched draft step samples every row with its
uniforms (`DraftSampling`), and each row's block is judged by the rule against the row's own
verify logits. So a row's tokens equal its batch-1 sampled generation with the same seed (up to the
float rounding of the batched verify, as in greedy), and the output is distributed as the target's
sampling at any B. `trace_rounds` keeps each generation's first rounds (`BatchResult.traces`, or handed to
`on_finish` as the generation ends) for `ready.decode.dist_check`.
On CUDA (default there) the verify of each block length and the batched draft step are replayed
from CUDA graphs captured per batch size; on CPU everything runs eagerly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from tqdm.auto import tqdm

from ready.cuda_graph import capture
from ready.decode.donor import donor_states, read_lengths
from ready.decode.engine import (
    AcceptFn, Generation, RoundTrace, _check_drafts, _sync, as_prompt, check_drafter, check_prompt, pick,
    sampled_draft, settle_round, target_device
)
from ready.decode.errors import DecodeError
from ready.decode.protocol import DraftStep, Drafter
from ready.decode.sampling import SamplingParams, draw, speculative_rounds, warp
from ready.reader import StateSource
from ready.target.ragged import (
    RaggedCache, RaggedGraphedVerify, new_ragged_cache, prefill_row, ragged_commit, ragged_verify
)


@dataclass
class BatchResult:
    """The outcome of one `BatchEngine.generate` call."""

    generations: list[Generation]  # one per prompt, in the prompts' order
    batch_size: int  # B, the concurrency
    wall_s: float  # first prefill .. last token of the whole call
    rounds: int  # batched target forwards (verify passes) after the prefills
    slot_rounds: list[int] = field(default_factory=list)  # rounds in which each slot was decoding
    traces: list[list[RoundTrace]] = field(default_factory=list)  # sampled: each generation's first rounds

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)

    @property
    def tokens_per_s(self) -> float:
        """Throughput at concurrency B: every committed token / the call's wall time."""
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


def _greedy_count(drafted: list[int], argmax: list[int]) -> int:
    a = 0
    while a < len(drafted) and drafted[a] == argmax[a]:
        a += 1
    return a


def is_block_drafter(drafter: Any) -> bool:
    """A DSpark / ReaDy drafter (its class says `batch_draft = True`: `BatchDraft` drives its draft step);
    anything else is asked row by row."""
    return getattr(type(drafter), "batch_draft", False) is True


class BatchDraft:
    """The DSpark / ReaDy draft step for B ragged rows over static buffers.

    Per row b with n[b] context tokens (committed tokens but the last; = the cache row's length):
    the drafter's context keys/values live in per-layer buffers [B, H_kv, cap, hd]; a row's prompt
    rows are projected when it is admitted (`admit`), and every step re-projects its last K+1 rows
    (no row gains more per round), as the single-sequence static draft step does. The block (anchor +
    K mask rows, `block_size` = K+1) sits at positions n[b] .. n[b]+K, attends to context rows < n[b] (the last `context_window` of them
    when set) through a per-row mask, and the reader reads row b of the target cache. The same
    drafter weights and pieces as `DSparkDrafter.draft`; one CUDA graph per engine (batch size)."""

    def __init__(self, drafter: Any, cache: RaggedCache, features: torch.Tensor, cuda_graphs: bool,
                 states: Optional[torch.Tensor] = None, mode: Optional[tuple[float, float]] = None) -> None:
        """`states`: what the reader reads, shaped like `cache.ssm` (default the cache itself; a donor
        state buffer for the state placebo). `mode`: None drafts greedily, (temperature, top_p) samples
        with the uniforms handed to each call."""
        self.d, self.mode = drafter, mode
        self.cache, self.features = cache, features
        B, cap = cache.batch_size, features.shape[1]
        self.B, self.cap, self.K = B, cap, drafter.proposals
        dev, dt = features.device, drafter.fc.weight.dtype
        attn = drafter.layers[0].self_attn
        self.hkv, self.hd = attn.num_kv_heads, attn.head_dim
        with torch.inference_mode(False):  # plain tensors: written in place in and out of inference mode
            shape = (B, self.hkv, cap, self.hd)
            self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in drafter.layers]
            self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in drafter.layers]
            self.tok = torch.zeros(B, dtype=torch.long, device=dev)
            self.rows_b = torch.arange(B, device=dev)
            self.ar_r = torch.arange(self.K + 1, device=dev)
            self.ar_cap = torch.arange(cap, device=dev)
            self.ones = torch.ones(B, self.K + 1, dtype=torch.bool, device=dev)
            self.u = torch.zeros(B, self.K, dtype=torch.float32, device=dev)  # sampling: a static input
        ssm = cache.ssm if states is None else states
        self.src = StateSource.from_cache(ssm, drafter._gdn_indices, B) if drafter.reader_enabled else None
        self.graphs = cuda_graphs and dev.type == "cuda"
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.out: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.failed = False

    @torch.no_grad()
    def admit(self, b: int, n: int) -> None:
        """Project the context rows 0..n-1 of row b (its prompt's features)."""
        if n <= 0:
            return
        d = self.d
        ctx = d._context(self.features[b:b + 1, :n])
        cos, sin = d._rope(torch.arange(n, device=ctx.device)[None])
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.kv(ctx, cos, sin)
            self.k[i][b:b + 1, :, :n] = k
            self.v[i][b:b + 1, :, :n] = v

    def _body(self) -> tuple[torch.Tensor, torch.Tensor]:
        d, B, K = self.d, self.B, self.K
        n = self.cache.lengths_t
        rows = (n - (K + 1)).clamp(min=0)[:, None] + self.ar_r  # [B, K+1]; rows >= n are masked below
        rows = rows.clamp(max=self.cap - 1)
        ctx = d._context(self.features[self.rows_b[:, None], rows])
        cos, sin = d._rope(rows)
        idx = rows[:, None, :, None].expand(B, self.hkv, K + 1, self.hd)
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.kv(ctx, cos, sin)
            self.k[i].scatter_(2, idx, k)
            self.v[i].scatter_(2, idx, v)
        sees = self.ar_cap[None, :] < n[:, None]
        if d.context_window:  # the last W context positions, as forward_train masks them
            sees = sees & (self.ar_cap[None, :] >= (n - d.context_window)[:, None])
        mask = torch.cat([sees, self.ones], dim=-1)[:, None, None, :].expand(B, 1, K + 1, self.cap + K + 1)
        read = None
        if self.src is not None:
            src = self.src
            read = lambda reader, h: reader(h, src)  # noqa: E731
        cos, sin = d._rope(n[:, None] + self.ar_r)
        h = d._backbone(d._block_input(self.tok), cos, sin, list(zip(self.k, self.v)), mask, read)[:, 1:]
        return d._finish(d._logits(h), self.tok, h, self.mode, self.u)

    def _capture(self, warmup: int = 2) -> None:
        # the warm-up calls write the same context rows the replay will
        self.graph, self.out = capture(self._body, warmup, "batched draft step")
        self.failed = self.graph is None

    @torch.no_grad()
    def __call__(self, tok: torch.Tensor, uniforms: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafts [B, K], logits or, sampled, q [B, K, V]) after the anchors `tok` [B] (each row's last
        committed token); sampled with `uniforms` [B, K]."""
        self.tok.copy_(tok)
        if uniforms is not None:
            self.u.copy_(uniforms)
        if self.graphs and self.graph is None and not self.failed:
            self._capture()
        if self.graph is None:
            return self._body()
        self.graph.replay()  # greedy: the logits stay in the graph's memory (nothing reads them; no copy)
        return self.out[0].clone(), (self.out[1].clone() if self.mode is not None else self.out[1])


class BatchEngine:
    """Decoding of many prompts through `batch_size` slots, greedy or sampled (module docstring)."""

    def __init__(self, target: Any, drafter: Optional[Drafter] = None, *, batch_size: int,
                 eos_token_id: Optional[int] = None, cuda_graphs: Optional[bool] = None,
                 accept_fn: Optional[AcceptFn] = None, sampling: Optional[SamplingParams] = None) -> None:
        """`accept_fn` (benchmarks only): replaces greedy matching per row with (drafts [n], argmax
        [n+1]) -> A, as in `Engine`; the output is then not lossless. `sampling` with temperature > 0
        samples (module docstring); None or temperature 0 is greedy."""
        if int(batch_size) < 1:
            raise DecodeError(f"batch_size={batch_size}; expected an integer >= 1")
        if drafter is not None:
            check_drafter(target, drafter)
        self.sampling = None if sampling is None or sampling.greedy else sampling
        if self.sampling is not None and accept_fn is not None:
            raise DecodeError("accept_fn forces greedy acceptance lengths; it cannot be combined with sampling "
                              "(temperature > 0)")
        self.target, self.drafter = target, drafter
        self.batch_size = int(batch_size)
        self.k = drafter.proposals if drafter is not None else 0
        self.capture = list(getattr(drafter, "capture_layers", []) or []) if drafter is not None else []
        self.eos = target.config.eos_token_id if eos_token_id is None else eos_token_id
        self.device = target_device(target)
        self.accept_fn = accept_fn
        self.graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.block_drafter = drafter is not None and is_block_drafter(drafter)
        self.cache: Optional[RaggedCache] = None
        self.features: Optional[torch.Tensor] = None
        self.draft: Optional[BatchDraft] = None
        self.donor_ssm: Optional[torch.Tensor] = None  # the states a donor-reading draft step reads
        self.donor_draft: Optional[BatchDraft] = None
        self.verifiers: dict[int, RaggedGraphedVerify] = {}

    # --- buffers ---------------------------------------------------------------------------------
    def reserve(self, max_len: int) -> None:
        """Size the cache and buffers for sequences of up to `max_len` tokens (prompt + new)."""
        self._prepare(max_len)

    def _prepare(self, max_len: int) -> None:
        need = max_len + self.k + 1  # room for a block verified past the budget (never committed)
        if self.cache is not None and self.cache.max_len >= need:
            self.cache.reset()
            return
        self.cache = new_ragged_cache(self.target, self.batch_size, need, max_verify=self.k + 1, spare=self.k + 1)
        self.features, self.draft, self.donor_ssm, self.donor_draft = None, None, None, None
        self.verifiers = {}
        if self.capture:
            cfg = self.target.config
            self.features = torch.zeros(self.batch_size, need, len(self.capture), cfg.hidden_size,
                                        dtype=self.target.dtype, device=self.device)
        if self.block_drafter:
            self.draft = BatchDraft(self.drafter, self.cache, self.features, self.graphs, mode=self._mode())

    def _verify(self, block: torch.Tensor) -> Any:
        t = block.shape[1]
        v = self.verifiers.get(t)
        if v is None:
            v = self.verifiers[t] = RaggedGraphedVerify(self.target, self.cache, t, self.capture) if self.graphs \
                else None
        if v is None:
            return ragged_verify(self.target, block, self.cache, self.capture)
        return v(block)

    def _store_features(self, hidden: torch.Tensor) -> None:
        """Verified tokens' features at each row's positions lengths..lengths+T-1 (before the commit);
        those past what the row commits are rewritten next round."""
        B, T = hidden.shape[:2]
        pos = (self.cache.lengths_t[:, None] + torch.arange(T, device=self.device)).clamp(max=self.features.shape[1] - 1)
        self.features[torch.arange(B, device=self.device)[:, None], pos] = hidden

    # --- donors (the state placebo) -----------------------------------------------------------------
    def _donor_layers(self, n_donors: int, n_prompts: int) -> list[int]:
        """The GDN layers whose states the donors replace ([] when the drafter reads none)."""
        if n_donors != n_prompts:
            raise DecodeError(f"{n_donors} donors for {n_prompts} prompts; expected one donor sequence per prompt")
        if self.drafter is None:
            raise DecodeError("a donor sequence only matters to a drafter that reads states; this engine has none")
        if not self.block_drafter:
            raise DecodeError(f"batched decoding on donor states needs a DSpark / ReaDy drafter, got "
                              f"{type(self.drafter).__name__}; decode it with Engine (concurrency 1)")
        layers = list(self.drafter.state_layers)
        if layers and self.donor_draft is None:
            self.donor_ssm = torch.zeros_like(self.cache.ssm)
            self.donor_draft = BatchDraft(self.drafter, self.cache, self.features, self.graphs, states=self.donor_ssm,
                                          mode=self._mode())
        return layers

    def _read_donor(self, b: int, states: torch.Tensor, at: int, slots: list[int]) -> None:
        """Row b of the donor buffer <- the donor's states after its `at`-th read length."""
        for j, s in enumerate(slots):
            self.donor_ssm[s, b].copy_(states[at, j])

    # --- drafting ----------------------------------------------------------------------------------
    def _mode(self) -> Optional[tuple[float, float]]:
        return None if self.sampling is None else (float(self.sampling.temperature), float(self.sampling.top_p))

    def _propose(self, last: torch.Tensor, live: list[bool], seqs: list[list[int]],
                 draft: Optional[BatchDraft] = None) -> torch.Tensor:
        """Greedy drafts [B, K] of every decoding row."""
        if draft is not None:
            return draft(last)[0]
        k, vocab = self.k, self.target.config.vocab_size
        out = torch.zeros(self.batch_size, k, dtype=torch.long, device=self.device)
        for b in range(self.batch_size):  # any other drafter: one batch-1 step per decoding row
            if live[b]:
                out[b] = _check_drafts(self.drafter.propose(self._row_step(b, seqs[b])), k, vocab, self.drafter)[0]
        return out

    def _row_step(self, b: int, seq: list[int]) -> DraftStep:
        t = len(seq)
        return DraftStep(tokens=torch.tensor(seq, dtype=torch.long, device=self.device)[None],
                         features=self.features[b:b + 1, :t - 1] if self.capture else None,
                         target=self.target, cache=self.cache.row_view(b))

    def _sample_drafts(self, last: torch.Tensor, live: list[bool], seqs: list[list[int]],
                       draft: Optional[BatchDraft], u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled drafts [B, K] and the distributions q [B, K, V] they were drawn from (a point mass for a
        drafter without `sample`), row b with uniforms u[b]."""
        if draft is not None:
            return draft(last, u.to(self.device))
        k, vocab = self.k, self.target.config.vocab_size
        drafts = torch.zeros(self.batch_size, k, dtype=torch.long, device=self.device)
        q = torch.zeros(self.batch_size, k, vocab, dtype=torch.float32, device=self.device)
        for b in range(self.batch_size):  # any other drafter: one batch-1 sampled step per decoding row
            if live[b]:
                d, q[b] = sampled_draft(self.drafter, self._row_step(b, seqs[b]), self.sampling, u[b].to(self.device), vocab)
                drafts[b] = d[0]
        return drafts, q


    # --- decoding ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int | Sequence[int],
                 progress: bool = False, desc: str = "",
                 donors: Optional[Sequence[Sequence[int] | torch.Tensor]] = None,
                 seeds: Optional[Sequence[int]] = None, trace_rounds: int = 0,
                 on_finish: Optional[Callable[[int, Generation, list[RoundTrace]], None]] = None) -> BatchResult:
        """Decode every prompt (greedy or sampled; speculatively with a drafter) through the engine's slots;
        the budget is one number or one per prompt. Generations come back in the prompts' order.
        `progress`: a progress bar over finished prompts. `donors`: one sequence per prompt whose
        committed states the drafter reads instead of the prompt's own (module docstring). Sampling:
        `seeds`, one per prompt (default the params' seed for all), and `trace_rounds`, the rounds of
        each generation kept in `BatchResult.traces`. `on_finish(i, generation, traces)` is called, off
        the clock, as soon as prompt i's generation ends (its traces are then not kept: a distribution
        check can run while the batch goes on, without holding every generation's traces)."""
        ids = [as_prompt(p) for p in prompts]
        if not ids:
            raise DecodeError("no prompts to decode; expected at least one")
        budgets = [int(max_new_tokens)] * len(ids) if isinstance(max_new_tokens, int) else [int(m) for m in max_new_tokens]
        if len(budgets) != len(ids):
            raise DecodeError(f"{len(budgets)} token budgets for {len(ids)} prompts; expected one number or one per prompt")
        for p, m in zip(ids, budgets):
            check_prompt(self.target, p, m)
        if seeds is not None and len(seeds) != len(ids):
            raise DecodeError(f"{len(seeds)} seeds for {len(ids)} prompts; expected one seed per prompt")
        sampling = self.sampling
        base_seed = 0 if sampling is None else int(sampling.seed)
        seed_of = [int(x) for x in seeds] if seeds is not None else [base_seed] * len(ids)
        traces: list[list[RoundTrace]] = [[] for _ in ids]
        self._prepare(max(p.numel() + m for p, m in zip(ids, budgets)))
        B, K, dev = self.batch_size, self.k, self.device
        layers = self._donor_layers(len(donors), len(ids)) if donors is not None else []
        draft = self.donor_draft if layers else self.draft
        donor_ids = [as_prompt(d).to(dev) for d in donors] if layers else []
        for d in donor_ids:
            check_prompt(self.target, d, 1)
        donor_slots = [self.target.gdn_index(int(i)) for i in layers]
        held: list[Optional[torch.Tensor]] = [None] * B  # each slot's donor states at its read lengths
        held_at = [-1] * B
        rng: list[Optional[torch.Generator]] = [None] * B  # sampling: each slot's generation's random numbers
        gens: list[Optional[Generation]] = [None] * len(ids)
        slot: list[Optional[int]] = [None] * B  # prompt index decoding in each slot
        seqs: list[list[int]] = [[] for _ in range(B)]  # committed tokens (prompt + new) per slot
        last_host = [0] * B
        slot_rounds = [0] * B
        queue = list(range(len(ids)))
        last = torch.zeros(B, dtype=torch.long, device=dev)
        bar = tqdm(total=len(ids), desc=desc or f"batch of {B}", disable=not progress, leave=False)

        _sync(dev)
        t0 = mark = time.perf_counter()
        off_clock = 0.0  # donor work, taken off the clock

        def finish(i: int) -> None:
            """Hand prompt i's ended generation and its traces to `on_finish`, off the clock."""
            nonlocal mark, off_clock
            if on_finish is None:
                return
            _sync(dev)
            start = time.perf_counter()
            on_finish(i, gens[i], traces[i])
            traces[i] = []
            spent = time.perf_counter() - start
            off_clock += spent
            mark += spent

        def admit(b: int) -> None:
            """Prefill queued prompts into slot b until one still has tokens to decode (or none is left)."""
            nonlocal mark, off_clock
            while queue:
                i = queue.pop(0)
                p = ids[i].to(dev)
                if self.drafter is not None and not self.block_drafter:
                    self.drafter.begin(p[None])
                out = prefill_row(self.target, self.cache, b, p, self.capture)
                rng[b] = None if sampling is None else torch.Generator().manual_seed(seed_of[i])
                first = int(pick(out.logits[0, -1], sampling, rng[b]))
                if self.capture:
                    self.features[b, :p.numel()] = out.hidden[0]
                    if draft is not None:
                        draft.admit(b, p.numel())
                _sync(dev)
                now = time.perf_counter()
                g = Generation(prompt_len=p.numel(), tokens=[first], proposals=K, prefill_s=now - mark,
                               wall_s=now - mark)
                mark = now
                if layers:  # the donor's states at every length this generation reads, off the clock

                    lengths = read_lengths(p.numel(), budgets[i], donor_ids[i].numel())
                    held[b], held_at[b] = donor_states(self.target, donor_ids[i], lengths, layers), -1
                    _sync(dev)
                    ready_at = time.perf_counter()
                    off_clock += ready_at - mark
                    mark = ready_at
                gens[i] = g
                if first == self.eos:
                    g.stop = "eos"
                if first == self.eos or budgets[i] <= 1:
                    bar.update(1)
                    finish(i)
                    continue
                slot[b], seqs[b], last_host[b] = i, ids[i].tolist() + [first], first
                last[b] = first
                return
            slot[b] = None

        for b in range(B):
            admit(b)
        rounds = 0
        while any(s is not None for s in slot):
            live = [s is not None for s in slot]
            if layers:  # each live row reads its donor after min(committed, donor length) tokens
                t_copy = time.perf_counter()
                for b in range(B):
                    if live[b]:
                        at = max(0, min(len(seqs[b]) - 1 - ids[slot[b]].numel(), held[b].shape[0] - 1))
                        if at != held_at[b]:
                            self._read_donor(b, held[b], at, donor_slots)
                            held_at[b] = at
                _sync(dev)
                spent = time.perf_counter() - t_copy  # off the clock: the round's span starts after it
                off_clock += spent
                mark += spent
            q = None
            if K and sampling is not None:  # each row's K uniforms for its drafts, as Engine draws them
                u = torch.zeros(B, K, dtype=torch.float32)
                for b in range(B):
                    if live[b]:
                        u[b] = torch.rand(K, generator=rng[b], dtype=torch.float32)
                drafts, q = self._sample_drafts(last, live, seqs, draft, u)
                block = torch.cat([last[:, None], drafts], dim=1)
            elif K:
                drafts = self._propose(last, live, seqs, draft)
                block = torch.cat([last[:, None], drafts], dim=1)
            else:
                block = last[:, None]
            out = self._verify(block)
            room = [min(K, budgets[slot[b]] - len(gens[slot[b]].tokens)) if live[b] else 0 for b in range(B)]
            if sampling is None:  # one device->host copy per round: every row's drafts and argmaxes
                host = torch.cat([block[:, 1:], out.logits.argmax(-1)], dim=1).cpu().tolist()
            else:
                host, warped = self._judge_sampled(block, out.logits, q, room, [r if x else None for r, x in zip(rng, live)])
            commit, advance = [1] * B, [0] * B
            ended = []
            for b in range(B):
                i = slot[b]
                if i is None:
                    continue
                g = gens[i]
                remaining = budgets[i] - len(g.tokens)
                n = room[b]
                drafted = host[b][:n]
                if sampling is not None:  # host[b] = drafts, A, next token; settle_round reads index A only
                    raw, tok = host[b][K], host[b][K + 1]
                    nexts = [-1] * (n + 1)
                    nexts[raw] = tok
                    if len(traces[i]) < trace_rounds and K:
                        traces[i].append(RoundTrace(start=len(seqs[b]), drafts=drafted, logits=out.logits[b, :n + 1].clone(),
                                                    p=warped[b].clone(), q=q[b, :n].clone(), accepted=raw))
                    res = settle_round(drafted, nexts, raw, remaining, self.eos)
                else:
                    argmax = host[b][K:K + n + 1]
                    if self.accept_fn is None:
                        raw = _greedy_count(drafted, argmax)
                    else:
                        raw = min(int(self.accept_fn(torch.tensor(drafted), torch.tensor(argmax))), n)
                    res = settle_round(drafted, argmax, raw, remaining, self.eos)
                commit[b] = advance[b] = res.commit
                g.tokens.extend(res.tokens)
                g.accepted.append(res.accepted)
                g.horizons.append(res.horizon)
                g.committed.append(len(res.tokens))
                seqs[b].extend(res.tokens)
                last_host[b] = res.tokens[-1]
                slot_rounds[b] += 1
                if res.eos:
                    g.stop = "eos"
                if res.eos or len(g.tokens) >= budgets[i]:
                    ended.append(b)
            if self.capture:
                self._store_features(out.hidden)
            upd = torch.tensor([commit, advance, last_host], dtype=torch.long).to(dev)
            ragged_commit(self.target, self.cache, upd[0], upd[1])
            last.copy_(upd[2])
            rounds += 1
            now = time.perf_counter()
            share = (now - mark) / sum(live)
            mark = now
            for b in range(B):
                if live[b]:
                    gens[slot[b]].wall_s += share
            bar.update(len(ended))
            for b in ended:
                finish(slot[b])
                admit(b)
        _sync(dev)
        end = time.perf_counter()
        bar.close()
        done = [g for g in gens if g is not None]
        if done and end > mark:  # the final synchronisation, charged to every generation alike
            for g in done:
                g.wall_s += (end - mark) / len(done)
        return BatchResult(generations=done, batch_size=B, wall_s=end - t0 - off_clock, rounds=rounds,
                           slot_rounds=slot_rounds, traces=[traces[i] for i, g in enumerate(gens) if g is not None])

    def _judge_sampled(self, block: torch.Tensor, logits: torch.Tensor, q: Optional[torch.Tensor], room: list[int],
                       rng: list[Optional[torch.Generator]]) -> tuple[list[list[int]], dict[int, torch.Tensor]]:
        """Each decoding row's (a row with a generator in `rng`) block under the speculative sampling rule with its own K + 1 uniforms (1 for
        an AR step), against its own verify logits -> (per row [K drafts, A, next token] on the host, the
        rows' warped target distributions p [n + 1, V]); all rows in one batched pass (`speculative_rounds`)
        and one host->device copy of their uniforms, one device->host copy of the results."""
        K, dev = self.k, self.device
        T, top_p = self.sampling.temperature, self.sampling.top_p
        acc = torch.zeros(self.batch_size, dtype=torch.long, device=dev)
        nxt = torch.zeros(self.batch_size, dtype=torch.long, device=dev)
        warped: dict[int, torch.Tensor] = {}
        live = [b for b, gen in enumerate(rng) if gen is not None]
        if live:
            idx = torch.tensor(live, device=dev)
            u = torch.stack([torch.rand(K + 1 if K else 1, generator=rng[b], dtype=torch.float32) for b in live]).to(dev)
            if not K:  # AR: one draw a row
                nxt[idx] = draw(warp(logits[idx, 0], T, top_p), u[:, 0])
            else:
                p = warp(logits[idx], T, top_p)
                n = torch.tensor([room[b] for b in live], device=dev)
                acc[idx], nxt[idx] = speculative_rounds(p, q[idx], block[idx, 1:], u[:, :K], u[:, K], n)
                warped = {b: p[i, :room[b] + 1] for i, b in enumerate(live)}
        host = torch.cat([block[:, 1:], acc[:, None], nxt[:, None]], dim=1).cpu().tolist()
        return host, warped


def generate_batch(target: Any, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int | Sequence[int],
                   drafter: Optional[Drafter] = None, batch_size: Optional[int] = None,
                   eos_token_id: Optional[int] = None) -> list[Generation]:
    """One-off batched greedy generation (AR without a drafter): `batch_size` slots (default: one per prompt)."""
    engine = BatchEngine(target, drafter, batch_size=batch_size or len(prompts), eos_token_id=eos_token_id)
    return engine.generate(prompts, max_new_tokens).generations


__all__ = ["BatchDraft", "BatchEngine", "BatchResult", "generate_batch", "is_block_drafter"]
