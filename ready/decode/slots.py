"""Where an engine's sequences live, and how the target and the drafter run on them.

`ready.decode.engine.Engine` runs one round loop for any number of slots. A slot store gives that loop
what depends on how the slots are laid out in memory: admit a prompt into a slot (its prefill), draft for
every decoding slot, verify a [B, K+1] block, commit what each slot kept, and put donor states where the
drafter reads them (the state placebo). Two stores:

- `RaggedSlots` (any B): a `RaggedCache`, one committed length per row; verify is the target's pass with
  per-row positions (`ready.target.ragged`; on CUDA replayed from `GraphRunner`'s graph of the block
  length) over the whole [B, K+1] block; a DSpark / ReaDy drafter drafts every row in one `BatchDraft`
  step, any other drafter is asked row by row.
- `SingleSlot` (B = 1, the paper's latency setting): the static `HybridCache` of one sequence. The target
  pass is the same (`HybridLM._run`, the same kernels), but the drafter runs its own draft step (with its
  own CUDA graph, any drafter), and the last round verifies only the drafts the budget can keep, so the
  cache never holds more than prompt + budget tokens.

The engine takes `SingleSlot` for one slot and `RaggedSlots` for more (`Engine(..., slots=...)` forces
either; `python -m benchmarks.engine --batch 1 --slots ragged` times a batch of one on the ragged store
beside the single-slot sections). Both produce the same tokens: tests/test_engine_batch.py decodes every
prompt through both.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ready.decode.batch_draft import BatchDraft, is_block_drafter
from ready.decode.errors import DecodeError
from ready.decode.graphs import GraphRunner
from ready.decode.protocol import DraftStep, Drafter
from ready.decode.rounds import greedy_draft, sampled_draft, target_device
from ready.decode.sampling import SamplingParams
from ready.target.ragged import RaggedCache, new_ragged_cache, prefill_row, prefill_rows, ragged_commit, ragged_verify

EXACT_PAD = 15  # exact mode with graphs: spare cache positions of every single-slot engine (>= K of any drafter)
# On CUDA the ragged store prefills the prompts it admits together in right-padded passes of up to this many
# (padded) tokens (`ready.target.ragged.prefill_rows`): one prompt of a few hundred tokens leaves most of the
# GPU idle, and a pass's scratch cache holds a GDN state per row (151 MB at the 27B shape). On CPU (its tables
# keep their bits), and in exact mode anywhere, one prefill per row: the single-sequence engine's computation.
ADMIT_TOKENS_CUDA = 8192


def admit_tokens_for(device: torch.device) -> int:
    """The default padded-token budget of a ragged store's admission passes on `device` (0: one prefill per
    row); exact mode, read per admission (`RaggedSlots.admit_many`), always prefills one row at a time."""
    return ADMIT_TOKENS_CUDA if device.type == "cuda" else 0


def admission_passes(lengths: Sequence[int], budget: int, alone_above: int = 0) -> list[list[int]]:
    """Indices of prompts of `lengths`, grouped into passes of at most `budget` padded tokens (rows x the
    longest), longest first so that rows of like length share a pass; a prompt longer than the budget, or than
    `alone_above` when > 0 (a target that prefills in pieces of that many tokens), passes alone. budget 0: one
    pass per prompt, in order."""
    if budget <= 0:
        return [[i] for i in range(len(lengths))]
    size = [budget + 1 if 0 < alone_above < n else n for n in lengths]  # past the budget: alone
    passes: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-size[j], j)):
        if passes and (len(passes[-1]) + 1) * size[passes[-1][0]] <= budget:
            passes[-1].append(i)
        else:
            passes.append([i])
    return passes


class SingleSlot:
    """One sequence in the target's static batch-1 cache (module docstring)."""

    batch_size = 1

    def __init__(self, target: Any, drafter: Optional[Drafter], capture: list[int], graphs: bool,
                 sampling: Optional[SamplingParams]) -> None:
        self.target, self.drafter, self.capture, self.sampling = target, drafter, capture, sampling
        self.k = drafter.proposals if drafter is not None else 0
        self.device = target_device(target)
        self.exact = bool(getattr(target, "exact", False))  # read when the engine is built
        # on CPU the runner runs the same static-cache path eagerly (tests)
        self.graphs: Optional[GraphRunner] = GraphRunner(target, capture) if graphs else None
        self.cache: Any = None
        self.tokens: Optional[torch.Tensor] = None  # [1, max_len] committed tokens
        self.features: Optional[torch.Tensor] = None  # [1, max_len, C, D] target features
        self.t = 0  # committed tokens in `tokens`
        self.donor_cache: Any = None  # the placebo's states, read by the drafter instead of `cache`
        self.reads_donor = False
        self._ahead = False  # this round was committed by `commit_ahead`

    # --- buffers -----------------------------------------------------------------------------------
    def pad_room(self, need: int) -> int:
        """Spare cache positions in exact mode with graphs: room for the last round padded to K+1 tokens,
        the same for every engine (AR too), so that AR and speculative static caches have one length:
        attention over a static cache reads the whole buffer, and its reduction may be split by the
        buffer's length (0 without exact mode or graphs, or without room)."""
        if not (self.exact and self.graphs is not None):
            return 0
        return max(0, min(EXACT_PAD, int(self.target.config.max_position_embeddings) - need))

    def prepare(self, max_len: int) -> None:
        """A cache and buffers for sequences of up to `max_len` tokens (reused, and reset, when large enough)."""
        need = max_len + self.pad_room(max_len)
        if self.cache is None or self.cache.max_len < need:
            self.cache = self.target.new_cache(batch_size=1, max_len=need, max_verify=self.k + 1)
            self.tokens = torch.zeros(1, need, dtype=torch.long, device=self.device)
            self.features = None
        else:
            self.cache.reset()
        if self.graphs is not None:
            self.graphs.prepare(self.cache)  # static cache mode from the prefill on
        self.reads_donor = False
        self._ahead = False

    def _store_features(self, start: int, hidden: Optional[torch.Tensor]) -> None:
        if not self.capture:
            return
        if hidden is None:
            raise RuntimeError("target returned no hidden features although capture_layers were requested")
        if self.features is None:
            shape = (1, self.tokens.shape[1]) + tuple(hidden.shape[2:])
            self.features = torch.zeros(shape, dtype=hidden.dtype, device=hidden.device)
        self.features[:, start:start + hidden.shape[1]] = hidden

    # --- a sequence --------------------------------------------------------------------------------
    def admit(self, b: int, ids: torch.Tensor) -> Any:
        """Forget the slot's sequence and prefill prompt `ids` [P] into it."""
        self.cache.reset()
        if self.graphs is not None:
            self.graphs.prepare(self.cache)
        p = ids.numel()
        self.tokens[0, :p] = ids
        self.t = p
        if self.drafter is not None:
            self.drafter.begin(ids[None])
        out = self.target.prefill(ids[None], self.cache, capture_layers=self.capture, last_logits_only=True)
        self._store_features(0, out.hidden)
        return out

    def admit_many(self, rows: Sequence[int], prompts: Sequence[torch.Tensor]) -> torch.Tensor:
        """`admit` for each (row, prompt); the last-position logits [n, V] (one slot: n is 1)."""
        return torch.cat([self.admit(b, p).logits[:, -1] for b, p in zip(rows, prompts)])

    def start(self, b: int, first: int) -> None:
        """The prefill's token is the sequence's first committed new token."""
        self.tokens[0, self.t] = first
        self.t += 1

    def anchors(self) -> torch.Tensor:
        """Each slot's last committed token, the next block's first, [B, 1] (on the device)."""
        return self.tokens[:, self.t - 1:self.t]

    # --- a round -----------------------------------------------------------------------------------
    def draft(self, seqs: list[list[int]], live: list[bool],
              uniforms: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """K drafts [1, K], with `uniforms` [1, K] (sampling) the distribution q [1, K, V] they come from, and
        the confidence head's step confidences [1, K] (None: greedy q, or a drafter without a head)."""
        k, vocab = self.k, self.target.config.vocab_size
        t = self.t
        step = DraftStep(tokens=self.tokens[:, :t], features=self.features[:, :t - 1] if self.capture else None,
                         target=self.target, cache=self.donor_cache if self.reads_donor else self.cache)
        if uniforms is None:
            drafts, conf = greedy_draft(self.drafter, step, k, vocab)
            return drafts, None, conf
        drafts, q, conf = sampled_draft(self.drafter, step, self.sampling, uniforms[0].to(self.device), vocab)
        return drafts, q[None], conf

    def warm_lengths(self, lengths: Sequence[int]) -> None:
        """Capture the verify graph of every block length in `lengths` now (CUDA; a confidence schedule
        verifies any of them), so that no capture or compile falls inside a timed generation."""
        if self.graphs is not None and self.device.type == "cuda":
            self.graphs.warm(self.cache, [t for t in lengths if t <= self.k + 1])

    def verify(self, block: torch.Tensor, room: list[int], scheduled: bool = False) -> Any:
        """The target's pass over the anchor and the first room[0] drafts of `block` [1, K+1] (a round never
        verifies drafts past the budget, so the cache never holds more than prompt + budget tokens).
        `scheduled` (a confidence schedule picked room[0]): every block length has its own graph."""
        t = room[0] + 1
        if t < block.shape[1]:
            block = block[:, :t]
        if self.graphs is not None and (t == self.k + 1 or scheduled):
            return self.graphs.verify(block, self.cache)
        if (self.graphs is not None and self.exact and t < self.k + 1
                and self.cache.length + self.k + 1 <= self.cache.max_len):
            # exact mode: the shortened last round through the K+1 graph, padded (rows past t unused,
            # uncommitted; causal, so they change nothing in rows < t)
            padded = torch.cat([block, block[:, -1:].expand(block.shape[0], self.k + 1 - t)], dim=1)
            out = self.graphs.verify(padded, self.cache)
            return type(out)(logits=out.logits[:, :t], hidden=None if out.hidden is None else out.hidden[:, :t])
        return self.target.verify(block, self.cache, capture_layers=self.capture)  # the last, shortened round

    def commit_ahead(self, argmaxes: torch.Tensor, live: list[bool]) -> None:
        """The greedy AR step's commit, issued before the host reads the token: the one verified token is
        always kept, and its argmax `argmaxes` [1, 1] goes into the committed tokens on the device, so the
        commit's launches queue behind the pass instead of following the host's read (the two-engine loop's
        order; after the read they lengthened every AR step, as a paired H100 A/B showed). The
        round's `commit` then only counts the token. (`live`: the one slot decodes.)"""
        self.target.commit(self.cache, 1)
        self.tokens[:, self.t:self.t + 1].copy_(argmaxes)
        self._ahead = True

    def commit(self, out: Any, kept: list[int], advance: list[int], appended: list[list[int]]) -> None:
        """Keep the first kept[0] verified tokens' states and features; append the round's tokens."""
        if self._ahead:  # committed by `commit_ahead`: one token, already written
            self._ahead = False
            self.t += len(appended[0])
            return
        if self.capture:
            self._store_features(self.cache.length, out.hidden[:, :kept[0]])
        self.target.commit(self.cache, kept[0])
        n = len(appended[0])
        if n == 1:  # (the AR step: a scalar write, no host->device copy)
            self.tokens[0, self.t] = appended[0][0]
        elif n:
            self.tokens[0, self.t:self.t + n] = torch.tensor(appended[0], dtype=torch.long, device=self.device)
        self.t += n

    # --- donors (the state placebo) ----------------------------------------------------------------
    def donor_layers(self) -> list[int]:
        """The GDN layers whose states a donor replaces (any drafter: every GDN layer unless it names some)."""
        if self.drafter is None:
            raise DecodeError("a donor sequence only matters to a drafter that reads states; this engine has none")
        return list(getattr(self.drafter, "state_layers", self.target.gdn_layer_ids))

    def use_donors(self) -> None:
        """The drafter reads the donor cache from now until the next `prepare`."""
        if self.donor_cache is None or self.donor_cache.max_len < self.cache.max_len:
            self.donor_cache = self.target.new_cache(batch_size=1, max_len=self.cache.max_len, max_verify=self.k + 1)
        else:
            self.donor_cache.reset()
        self.reads_donor = True

    def read_donor(self, b: int, states: torch.Tensor, at: int, slots: Sequence[int], length: int) -> None:
        """The donor cache <- the donor's states after its `at`-th read length (`length` tokens; its GDN states
        only: KV and conv windows stay unfilled)."""
        for j, slot in enumerate(slots):
            self.donor_cache.ssm[slot, 0].copy_(states[at, j])
        self.donor_cache.length = length


class RaggedSlots:
    """B sequences in one `RaggedCache`, each at its own length (module docstring)."""

    def __init__(self, target: Any, drafter: Optional[Drafter], capture: list[int], graphs: bool,
                 sampling: Optional[SamplingParams], batch_size: int, admit_tokens: Optional[int] = None) -> None:
        self.target, self.drafter, self.capture, self.sampling = target, drafter, capture, sampling
        self.batch_size = int(batch_size)
        self.k = drafter.proposals if drafter is not None else 0
        self.device = target_device(target)
        # the padded-token budget of a pass that admits several prompts (0: one prefill per row)
        self.admit_tokens = admit_tokens_for(self.device) if admit_tokens is None else int(admit_tokens)
        # one captured verify per block length (on CPU the same objects run eagerly); every block is K+1
        self.graphs: Optional[GraphRunner] = GraphRunner(target, capture, short_rounds=False) if graphs else None
        self.block_drafter = drafter is not None and is_block_drafter(drafter)
        self.cache: Optional[RaggedCache] = None
        self.features: Optional[torch.Tensor] = None
        self.draft_step: Optional[BatchDraft] = None  # the batched draft step on the cache's states
        self.donor_ssm: Optional[torch.Tensor] = None  # the states a donor-reading draft step reads
        self.donor_draft: Optional[BatchDraft] = None
        self.reads_donor = False
        self._last = torch.zeros(self.batch_size, dtype=torch.long, device=self.device)
        self._last_host = [0] * self.batch_size
        self._ahead = False  # this round was committed by `commit_ahead`

    def _mode(self) -> Optional[tuple[float, float]]:
        return None if self.sampling is None else (float(self.sampling.temperature), float(self.sampling.top_p))

    # --- buffers -----------------------------------------------------------------------------------
    def prepare(self, max_len: int) -> None:
        """A cache and buffers for sequences of up to `max_len` tokens (reused, and reset, when large enough)."""
        self.reads_donor = False
        self._ahead = False
        need = max_len + self.k + 1  # room for a block verified past the budget (never committed)
        if self.cache is not None and self.cache.max_len >= need:
            self.cache.reset()
            return
        self.cache = new_ragged_cache(self.target, self.batch_size, need, max_verify=self.k + 1, spare=self.k + 1)
        self.features, self.draft_step, self.donor_ssm, self.donor_draft = None, None, None, None
        if self.graphs is not None:
            self.graphs.prepare(self.cache)  # (a new cache: its graphs are captured afresh)
        if self.capture:
            cfg = self.target.config
            self.features = torch.zeros(self.batch_size, need, len(self.capture), cfg.hidden_size,
                                        dtype=self.target.dtype, device=self.device)
        if self.block_drafter:
            self.draft_step = BatchDraft(self.drafter, self.cache, self.features, self.graphs is not None,
                                         mode=self._mode())

    def _draft_step(self) -> Optional[BatchDraft]:
        return self.donor_draft if self.reads_donor else self.draft_step

    # --- a sequence --------------------------------------------------------------------------------
    def admit(self, b: int, ids: torch.Tensor) -> Any:
        """Forget row b and prefill prompt `ids` [P] into it."""
        if self.drafter is not None and not self.block_drafter:
            self.drafter.begin(ids[None])
        out = prefill_row(self.target, self.cache, b, ids, self.capture, last_logits_only=True)
        self._admitted(b, ids.numel(), None if out.hidden is None else out.hidden[0])
        return out

    def admit_many(self, rows: Sequence[int], prompts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Forget rows `rows` and prefill prompt i into row rows[i]: prompts of like length together in passes of
        at most `admit_tokens` padded tokens (`admission_passes`); returns the last-position logits [n, V]."""
        lengths = [int(p.numel()) for p in prompts]
        logits: list[Optional[torch.Tensor]] = [None] * len(rows)
        exact = bool(getattr(self.target, "exact", False))
        piece = int(getattr(self.target, "prefill_chunk", 0))  # longer prompts prefill in pieces, one row at a time
        for group in admission_passes(lengths, 0 if exact else self.admit_tokens, piece):
            if len(group) == 1:
                i = group[0]
                logits[i] = self.admit(rows[i], prompts[i]).logits[0, -1]
                continue
            if self.drafter is not None and not self.block_drafter:
                for i in group:
                    self.drafter.begin(prompts[i][None])
            out = prefill_rows(self.target, self.cache, [rows[i] for i in group], [prompts[i] for i in group],
                               self.capture)
            for j, i in enumerate(group):
                logits[i] = out.logits[j, -1]
                self._admitted(rows[i], lengths[i], None if out.hidden is None else out.hidden[j, :lengths[i]])
        return torch.stack(logits)

    def _admitted(self, b: int, n: int, hidden: Optional[torch.Tensor]) -> None:
        """Row b now holds an n-token prompt: its features where the drafter reads them."""
        if self.capture:
            self.features[b, :n] = hidden
            step = self._draft_step()
            if step is not None:
                step.admit(b, n)

    def start(self, b: int, first: int) -> None:
        """The prefill's token is row b's first committed new token."""
        self._last[b] = first
        self._last_host[b] = first

    def anchors(self) -> torch.Tensor:
        """Each row's last committed token, the next block's first, [B, 1] (on the device)."""
        return self._last[:, None]

    # --- a round -----------------------------------------------------------------------------------
    def _row_step(self, b: int, seq: list[int]) -> DraftStep:
        t = len(seq)
        return DraftStep(tokens=torch.tensor(seq, dtype=torch.long, device=self.device)[None],
                         features=self.features[b:b + 1, :t - 1] if self.capture else None,
                         target=self.target, cache=self.cache.row_view(b))

    def draft(self, seqs: list[list[int]], live: list[bool],
              uniforms: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Drafts [B, K] of every decoding row, with `uniforms` [B, K] (sampling) the distributions q
        [B, K, V] they were drawn from (a point mass for a drafter without `sample`), and the confidence
        head's step confidences [B, K] (None: greedy q, or a drafter without a confidence head)."""
        step = self._draft_step()
        if step is not None:
            if uniforms is None:
                drafts, _, conf = step(self._last)
                return drafts, None, conf
            return step(self._last, uniforms.to(self.device))
        k, vocab = self.k, self.target.config.vocab_size
        drafts = torch.zeros(self.batch_size, k, dtype=torch.long, device=self.device)
        q = None if uniforms is None else torch.zeros(self.batch_size, k, vocab, dtype=torch.float32, device=self.device)
        conf: Optional[torch.Tensor] = None
        for b in range(self.batch_size):  # any other drafter: one batch-1 step per decoding row
            if not live[b]:
                continue
            if uniforms is None:
                d, c = greedy_draft(self.drafter, self._row_step(b, seqs[b]), k, vocab)
            else:
                d, q[b], c = sampled_draft(self.drafter, self._row_step(b, seqs[b]), self.sampling,
                                           uniforms[b].to(self.device), vocab)
            drafts[b] = d[0]
            if c is not None:
                conf = torch.ones(self.batch_size, k, dtype=torch.float32, device=self.device) if conf is None else conf
                conf[b] = c[0]
        return drafts, q, conf

    def warm_lengths(self, lengths: Sequence[int]) -> None:
        """Capture the ragged verify graph of every block width in `lengths` now (CUDA; a confidence schedule
        verifies any of them), so that no capture or compile falls inside a timed call."""
        if self.graphs is not None and self.device.type == "cuda":
            self.graphs.warm(self.cache, [t for t in lengths if t <= self.k + 1])

    def verify(self, block: torch.Tensor, room: list[int], scheduled: bool = False) -> Any:
        """One ragged pass over the [B, K+1] block (drafts past a row's budget are verified, never kept);
        `scheduled` (a confidence schedule picked the rooms): over its first T = max(room) + 1 columns only,
        row b judged on its own first room[b] drafts (the ragged rows' positions past it are never read)."""
        if scheduled:
            block = block[:, :max(room) + 1]
        if self.graphs is None:
            return ragged_verify(self.target, block, self.cache, self.capture)
        return self.graphs.verify(block, self.cache)

    def commit_ahead(self, argmaxes: torch.Tensor, live: list[bool]) -> None:
        """The greedy AR round's commit before the host read (as `SingleSlot.commit_ahead`): every decoding
        row keeps its one verified token and moves by one, the others stay; each decoding row's anchor
        becomes its argmax (`argmaxes` [B, 1]) on the device. The round's `commit` then only notes the
        anchors on the host."""
        moves = torch.tensor(live, dtype=torch.long).to(self.device)
        ragged_commit(self.target, self.cache, torch.ones_like(moves), moves)
        self._last.copy_(torch.where(moves.bool(), argmaxes[:, 0], self._last))
        self._ahead = True

    def commit(self, out: Any, kept: list[int], advance: list[int], appended: list[list[int]]) -> None:
        """Row b keeps its first kept[b] verified tokens and its length moves by advance[b] (0: a row with
        nothing to decode); the features of the verified tokens go in before the lengths move."""
        for b, toks in enumerate(appended):
            if toks:
                self._last_host[b] = toks[-1]
        if self._ahead:  # committed by `commit_ahead`: only the host's copy of the anchors had to catch up
            self._ahead = False
            return
        if self.capture:
            B, T = out.hidden.shape[:2]
            pos = (self.cache.lengths_t[:, None] + torch.arange(T, device=self.device)).clamp(max=self.features.shape[1] - 1)
            self.features[torch.arange(B, device=self.device)[:, None], pos] = out.hidden
        upd = torch.tensor([kept, advance, self._last_host], dtype=torch.long).to(self.device)  # one copy a round
        ragged_commit(self.target, self.cache, upd[0], upd[1])
        self._last.copy_(upd[2])

    # --- donors (the state placebo) ----------------------------------------------------------------
    def donor_layers(self) -> list[int]:
        """The GDN layers whose states a donor replaces (a DSpark / ReaDy drafter's `state_layers`)."""
        if self.drafter is None:
            raise DecodeError("a donor sequence only matters to a drafter that reads states; this engine has none")
        if not self.block_drafter:
            raise DecodeError(f"batched decoding on donor states needs a DSpark / ReaDy drafter, got "
                              f"{type(self.drafter).__name__}; decode it with one slot (concurrency 1)")
        return list(self.drafter.state_layers)

    def use_donors(self) -> None:
        """The draft step reads the donor state buffer from now until the next `prepare`."""
        if self.donor_draft is None:
            self.donor_ssm = torch.zeros_like(self.cache.ssm)
            self.donor_draft = BatchDraft(self.drafter, self.cache, self.features, self.graphs is not None,
                                          states=self.donor_ssm, mode=self._mode())
        self.reads_donor = True

    def read_donor(self, b: int, states: torch.Tensor, at: int, slots: Sequence[int], length: int) -> None:
        """Row b of the donor buffer <- the donor's states after its `at`-th read length."""
        for j, s in enumerate(slots):
            self.donor_ssm[s, b].copy_(states[at, j])


__all__ = ["ADMIT_TOKENS_CUDA", "EXACT_PAD", "RaggedSlots", "SingleSlot", "admission_passes", "admit_tokens_for"]
