"""The decoding engine: autoregressive and block speculative decoding over the hybrid target, one sequence
or many at once, greedy or sampled. A single sequence is a batch of one.

`Engine(target, drafter, batch_size=B).decode(prompts, max_new_tokens)` decodes any number of prompts
through B slots (continuous batching: a slot whose sequence ended takes the next prompt);
`engine.generate(prompt, max_new_tokens)` is one prompt through it. One speculative round, for every
decoding slot at once:

1. the drafter proposes K tokens d_1..d_K after the slot's last committed token x;
2. one target forward verifies the block [x, d_1..d_K] and gives K+1 greedy argmaxes p_0..p_K (each
   verified token's GDN inputs go to `cache.pending_*`; the live states are untouched);
3. A = the longest prefix with d_j == p_{j-1}; the round appends d_1..d_A and the target's correction p_A
   (the bonus token when A = K): exactly the next A+1 tokens greedy autoregressive decoding would
   produce, so the output is lossless by construction (`ready.decode.rounds.settle_round`);
4. the commit keeps the states after x, d_1..d_A: rejected drafts leave no trace in the GDN states or
   the attention KV; each slot's length moves by what it kept.

The token budget and EOS truncate the appended tokens; the round's horizon h (draft positions that could
still be observed, `ready.metrics`) is min(K, tokens left, position of the first accepted EOS draft), and
A is capped at h. A verify schedule that verifies only n < K drafts does not move h: draft n + 1 is a stop
(observed, not accepted), never censored (`settle_round`). A slot with nothing to decode (its sequence
ended, no prompt left) is still computed (fixed shapes) but keeps nothing and appends nothing.

Where the slots live, and so which kernels run, is the slot store's business (`ready.decode.slots`): one
slot runs the target's static batch-1 passes (`SingleSlot`), several a ragged batch (`RaggedSlots`); the
rounds, their settlement, sampling, donors and timing are this module's, the same for both.

Timing: one clock for the whole call (a device synchronisation at both ends on CUDA). Every span is
charged to the slots it served: a prefill to its slot, a round in equal shares to the slots still
decoding in it. So each generation's `wall_s` is its share of the clock (with one slot: its prefill
through its last token), the shares add up to the call's wall time, and a benchmark's TPS (sum of new
tokens / sum of wall times, `ready.metrics`) is the throughput at concurrency B. `prefill_s` is the
generation's own prefill.

Exact mode (`target.exact`, read when the engine is built): verify and the AR step run the target's
row-invariant ops, so the speculative output equals AR token for token in any dtype, and a slot's
tokens equal its single-slot generation's.

Donors (the state placebo, the state swap): `decode(..., donors=...)` gives prompt i another text whose
committed states the drafter reads in place of its own: in the round after c committed tokens, the
donor's states after min(c, donor length) of its tokens (`ready.decode.donor`, computed off the clock
when the prompt is admitted). They are copied where the drafter reads them; verification, and so the
output, stays the target's own. The copies are taken off the clock.

Sampling (`sampling` with temperature > 0, `ready.decode.sampling`): AR draws each token from the warped
target distribution p; a speculative round draws the block from the drafter's q position by position
(`drafter.sample`; a drafter without it is deterministic, q a point mass), then accepts draft j with
probability min(1, p_j(d_j)/q_j(d_j)), draws the correction from normalise(max(0, p_A - q_A)) at the
first rejection, or the bonus from p_K after a full block. The output is distributed exactly as AR
sampling. One CPU generator per generation (seeded by `seeds`, default the params' seed) supplies the
uniforms in a fixed order: 1 for the prefill's token; per round K for the drafts, then K + 1 for the
acceptance; 1 per AR step; so rows that decode the same (prompt, seed) share their random numbers at any
B. `trace_rounds` keeps each generation's first rounds (p, q, drafts) for `ready.decode.dist_check`.

Confidence-scheduled verification (`verify_schedule`, `ready.decode.schedule`): with a `confidence`
schedule, each round reads the drafter's confidence head's step confidences of every decoding row (one
device->host copy between the draft and the verify), and row b verifies only the first L_b drafts its
schedule keeps (threshold and/or batch budget; 0..K, never more than its budget can keep): the round's
`room`. One slot verifies exactly its L + 1 tokens; ragged slots verify one [B, T] pass with T = the
longest row's L + 1, each row judged on its own L_b drafts (the positions past them are verified but never
read or kept, as drafts past a row's budget are). Greedy and sampled outputs stay exact (the schedule is a
stopping time of the drafts; `ready.decode.schedule`). Each generation records its drafts verified per
round (`Generation.verified`) and, from a drafter with a confidence head, every round's confidences
(`Generation.confidence`, under either schedule: `ready.calibration` scores them). `confidence_fn`
(engine benchmarks only) supplies forced confidences in place of the drafter's. On CUDA every block length
1..K+1 a schedule can ask for is captured when the engine is sized (`reserve`, or the first `decode`).

On CUDA (default there) the target's verify of each block length and the draft step are replayed from
CUDA graphs; prefill and the bookkeeping run eagerly. On CPU everything runs eagerly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from tqdm.auto import tqdm

from ready.decode.donor import donor_states, read_lengths
from ready.decode.errors import DecodeError
from ready.decode.protocol import Drafter
from ready.decode.rounds import (
    AcceptFn, Generation, RoundTrace, as_prompt, check_drafter, check_prompt, greedy_count, pick, settle_round, sync,
    target_device
)
from ready.decode.sampling import SamplingParams, draw, speculative_rounds, warp
from ready.decode.schedule import VerifySchedule
from ready.decode.slots import RaggedSlots, SingleSlot

# engine benchmarks only: row b's forced step confidences c_1..c_K for this round (`Engine(confidence_fn=...)`)
ConfidenceFn = Callable[[int], Sequence[float]]

SLOTS = ("single", "ragged")


@dataclass
class BatchResult:
    """The outcome of one `Engine.decode` call."""

    generations: list[Generation]  # one per prompt, in the prompts' order
    batch_size: int  # B, the concurrency
    wall_s: float  # first prefill .. last token of the whole call
    rounds: int  # target forwards (verify passes) after the prefills
    slot_rounds: list[int] = field(default_factory=list)  # rounds in which each slot was decoding
    # tokens each round's verify pass ran over: slots x its width (ragged), or the one slot's L + 1
    verify_tokens: list[int] = field(default_factory=list)
    traces: list[list[RoundTrace]] = field(default_factory=list)  # sampled: each generation's first rounds

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)

    @property
    def tokens_per_s(self) -> float:
        """Throughput at concurrency B: every committed token / the call's wall time."""
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


class Engine:
    """Decodes prompts through `batch_size` slots with one target (and optionally one drafter), greedy or
    sampled (module docstring); buffers, caches and CUDA graphs are reused across calls."""

    def __init__(self, target: Any, drafter: Optional[Drafter] = None, *, batch_size: int = 1,
                 eos_token_id: Optional[int] = None, cuda_graphs: Optional[bool] = None,
                 accept_fn: Optional[AcceptFn] = None, sampling: Optional[SamplingParams] = None,
                 slots: Optional[str] = None, verify_schedule: Optional[VerifySchedule] = None,
                 confidence_fn: Optional[ConfidenceFn] = None, capture_all_lengths: bool = True,
                 admit_tokens: Optional[int] = None) -> None:
        """`eos_token_id` defaults to `target.config.eos_token_id`. `cuda_graphs` (default: on CUDA) replays
        captured verify and draft graphs. `accept_fn` (engine benchmarks only) replaces greedy matching with
        (drafts [n], argmax [n+1]) -> A; the output is then not lossless. `sampling` with temperature > 0
        samples; None or temperature 0 is greedy. `slots`: "single" (one slot, the static batch-1 passes)
        or "ragged" (any number); default single for one slot, ragged for more (`ready.decode.slots`).
        `verify_schedule` (default full): which drafts a round verifies (`ready.decode.schedule`); a
        confidence schedule needs a drafter with a confidence head, or `confidence_fn` (engine benchmarks
        only: row b's forced confidences for the round, called for every decoding row in row order).
        `capture_all_lengths` (a confidence schedule on CUDA): capture the verify of every block length when
        the engine is sized (default); False captures each length on first use (engine benchmarks, whose
        warm-up call replays the timed calls' rounds: only the lengths they use are compiled). `admit_tokens`
        (ragged slots): prompts admitted together are prefilled in right-padded passes of up to this many padded
        tokens, 0 one prefill per row (default `ready.decode.slots.admit_tokens_for`: packed on CUDA outside exact
        mode, one per row elsewhere)."""
        if int(batch_size) < 1:
            raise DecodeError(f"batch_size={batch_size}; expected an integer >= 1")
        kind = slots or ("single" if int(batch_size) == 1 else "ragged")
        if kind not in SLOTS or (kind == "single" and int(batch_size) != 1):
            raise DecodeError(f"slots={slots!r} with batch_size={batch_size}; expected 'single' (batch_size 1) "
                              "or 'ragged'")
        if drafter is not None:
            check_drafter(target, drafter)
        self.sampling = None if sampling is None or sampling.greedy else sampling
        if self.sampling is not None and accept_fn is not None:
            raise DecodeError("accept_fn forces greedy acceptance lengths; it cannot be combined with sampling "
                              "(temperature > 0)")
        self.schedule = verify_schedule or VerifySchedule()
        self.confidence_fn = confidence_fn
        self.capture_all_lengths = bool(capture_all_lengths)
        if (self.schedule.scheduled and drafter is not None and confidence_fn is None
                and (getattr(drafter, "confidence_head", None) is None or not hasattr(drafter, "draft_scored"))):
            raise DecodeError(f"verify schedule 'confidence' reads the drafter's confidence head, and drafter "
                              f"{type(drafter).__name__} has none; expected a DSpark drafter with a confidence head "
                              "(drafter.confidence_head: true, or a DSpark checkpoint that has one) or the full schedule")
        self.target, self.drafter = target, drafter
        self.batch_size = int(batch_size)
        self.k = drafter.proposals if drafter is not None else 0
        capture = list(getattr(drafter, "capture_layers", []) or []) if drafter is not None else []
        self.eos = target.config.eos_token_id if eos_token_id is None else eos_token_id
        self.device = target_device(target)
        self.accept_fn = accept_fn
        graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.slots: SingleSlot | RaggedSlots = (
            SingleSlot(target, drafter, capture, graphs, self.sampling) if kind == "single"
            else RaggedSlots(target, drafter, capture, graphs, self.sampling, self.batch_size, admit_tokens))
        self.traces: list[RoundTrace] = []  # `generate`: the first rounds of the last generation, when asked

    def reserve(self, max_len: int) -> None:
        """Size the cache and buffers for sequences of up to `max_len` tokens (prompt + new); with a
        confidence schedule on CUDA, capture the verify of every block length it can ask for."""
        self.slots.prepare(max_len)
        if self.schedule.scheduled and self.k and self.capture_all_lengths:
            self.slots.warm_lengths(range(1, self.k + 2))

    def _confidences(self, conf: Optional[torch.Tensor], live: list[bool]) -> list[Optional[list[float]]]:
        """Each decoding row's step confidences on the host (None for a row with nothing to decode): the
        forced ones of `confidence_fn`, else the drafter's [B, K] (none: every row None)."""
        if self.confidence_fn is not None:
            return [[float(c) for c in self.confidence_fn(b)] if x else None for b, x in enumerate(live)]
        if conf is None:
            return [None] * len(live)
        rows = conf.float().cpu().tolist()
        return [r if x else None for r, x in zip(rows, live)]

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int,
                 donor: Optional[Sequence[int] | torch.Tensor] = None, seed: Optional[int] = None,
                 trace_rounds: int = 0) -> Generation:
        """One prompt: up to `max_new_tokens` new tokens. `donor`: the sequence whose committed states the
        drafter reads instead of this one's (the state placebo). `seed` (sampling): this generation's
        random numbers (default the params' seed). `trace_rounds` (sampling): the first rounds kept in
        `self.traces`."""
        res = self.decode([prompt], max_new_tokens, donors=None if donor is None else [donor],
                          seeds=None if seed is None else [seed], trace_rounds=trace_rounds)
        self.traces = res.traces[0]
        return res.generations[0]

    @torch.inference_mode()
    def decode(self, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int | Sequence[int],
               progress: bool = False, desc: str = "",
               donors: Optional[Sequence[Sequence[int] | torch.Tensor]] = None,
               seeds: Optional[Sequence[int]] = None, trace_rounds: int = 0,
               on_finish: Optional[Callable[[int, Generation, list[RoundTrace]], None]] = None) -> BatchResult:
        """Decode every prompt through the engine's slots; the budget is one number or one per prompt.
        Generations come back in the prompts' order. `progress`: a progress bar over finished prompts.
        `donors`: one sequence per prompt whose committed states the drafter reads instead of the prompt's
        own. Sampling: `seeds`, one per prompt (default the params' seed for all), and `trace_rounds`, the
        rounds of each generation kept in `BatchResult.traces`. `on_finish(i, generation, traces)` is called,
        off the clock, as soon as prompt i's generation ends (its traces are then not kept: a distribution
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
        if donors is not None and len(donors) != len(ids):
            raise DecodeError(f"{len(donors)} donors for {len(ids)} prompts; expected one donor sequence per prompt")
        sampling, slots = self.sampling, self.slots
        base_seed = 0 if sampling is None else int(sampling.seed)
        seed_of = [int(x) for x in seeds] if seeds is not None else [base_seed] * len(ids)
        traces: list[list[RoundTrace]] = [[] for _ in ids]
        self.reserve(max(p.numel() + m for p, m in zip(ids, budgets)))
        B, K, dev = self.batch_size, self.k, self.device
        layers = slots.donor_layers() if donors is not None else []
        if layers:
            slots.use_donors()
        donor_ids = [as_prompt(d).to(dev) for d in donors] if layers else []
        for d in donor_ids:
            check_prompt(self.target, d, 1)
        donor_slots = [self.target.gdn_index(int(i)) for i in layers]
        held: list[Optional[torch.Tensor]] = [None] * B  # each slot's donor states at its read lengths
        held_lengths: list[list[int]] = [[] for _ in range(B)]
        held_at = [-1] * B
        rng: list[Optional[torch.Generator]] = [None] * B  # sampling: each slot's generation's random numbers
        gens: list[Optional[Generation]] = [None] * len(ids)
        slot: list[Optional[int]] = [None] * B  # prompt index decoding in each slot
        seqs: list[list[int]] = [[] for _ in range(B)]  # committed tokens (prompt + new) per slot
        slot_rounds = [0] * B
        verify_tokens: list[int] = []
        queue = list(range(len(ids)))
        bar = tqdm(total=len(ids), desc=desc or f"batch of {B}", disable=not progress, leave=False)

        sync(dev)
        t0 = mark = time.perf_counter()
        off_clock = 0.0  # donor work and on_finish, taken off the clock

        def finish(i: int) -> None:
            """Hand prompt i's ended generation and its traces to `on_finish`, off the clock."""
            nonlocal mark, off_clock
            if on_finish is None:
                return
            sync(dev)
            start = time.perf_counter()
            on_finish(i, gens[i], traces[i])
            traces[i] = []
            spent = time.perf_counter() - start
            off_clock += spent
            mark += spent

        def admit(free: list[int]) -> None:
            """Prefill queued prompts into the free slots, together (`slots.admit_many`), until each holds one
            with tokens to decode or none is left; a pass's time is shared by the prompts it prefilled."""
            nonlocal mark, off_clock
            while free and queue:
                rows = free[:len(queue)]
                taken = [queue.pop(0) for _ in rows]
                last = slots.admit_many(rows, [ids[i].to(dev) for i in taken])
                for b, i in zip(rows, taken):
                    rng[b] = None if sampling is None else torch.Generator().manual_seed(seed_of[i])
                firsts = [int(pick(last[j], sampling, rng[b])) for j, b in enumerate(rows)]
                sync(dev)
                now = time.perf_counter()
                share = (now - mark) / len(rows)
                mark = now
                free = free[len(rows):]
                for b, i, first in zip(rows, taken, firsts):
                    g = Generation(prompt_len=ids[i].numel(), tokens=[first], proposals=K, prefill_s=share,
                                   wall_s=share)
                    if layers:  # the donor's states at every length this generation reads, off the clock
                        held_lengths[b] = read_lengths(ids[i].numel(), budgets[i], donor_ids[i].numel())
                        held[b], held_at[b] = donor_states(self.target, donor_ids[i], held_lengths[b], layers), -1
                        sync(dev)
                        ready_at = time.perf_counter()
                        off_clock += ready_at - mark
                        mark = ready_at
                    gens[i] = g
                    if first == self.eos:
                        g.stop = "eos"
                    if first == self.eos or budgets[i] <= 1:
                        bar.update(1)
                        finish(i)
                        free.append(b)
                        continue
                    slot[b], seqs[b] = i, ids[i].tolist() + [first]
                    slots.start(b, first)
            for b in free:
                slot[b] = None

        admit(list(range(B)))
        rounds = 0
        while any(s is not None for s in slot):
            live = [s is not None for s in slot]
            if layers:  # each live slot reads its donor after min(committed, donor length) tokens
                t_copy = time.perf_counter()
                for b in range(B):
                    if live[b]:
                        at = max(0, min(len(seqs[b]) - 1 - ids[slot[b]].numel(), held[b].shape[0] - 1))
                        if at != held_at[b]:
                            slots.read_donor(b, held[b], at, donor_slots, held_lengths[b][at])
                            held_at[b] = at
                sync(dev)
                spent = time.perf_counter() - t_copy  # off the clock: the round's span starts after it
                off_clock += spent
                mark += spent
            room = [min(K, budgets[slot[b]] - len(gens[slot[b]].tokens)) if live[b] else 0 for b in range(B)]
            unscheduled = list(room)  # what each row could verify before its schedule (the traces keep it)
            q = conf = None
            conf_host: list[Optional[list[float]]] = [None] * B
            anchors = slots.anchors()
            if K:
                u = None
                if sampling is not None:  # each slot's K uniforms for its drafts
                    u = torch.zeros(B, K, dtype=torch.float32)
                    for b in range(B):
                        if live[b]:
                            u[b] = torch.rand(K, generator=rng[b], dtype=torch.float32)
                drafts, q, conf = slots.draft(seqs, live, u)
                block = torch.cat([anchors, drafts.to(dev)], dim=1)
                if self.schedule.scheduled:  # the rows' confidences decide what this round verifies
                    conf_host = self._confidences(conf, live)
                    room = self.schedule.lengths(conf_host, room)
            else:
                block = anchors
            out = slots.verify(block, room, self.schedule.scheduled)
            verify_tokens.append(int(out.logits.shape[0] * out.logits.shape[1]))
            if sampling is None:  # one device->host copy per round: every slot's drafts and argmaxes
                argmaxes = out.logits.argmax(-1)
                if not K:  # the greedy AR step keeps its one token whatever it is: commit before the read
                    slots.commit_ahead(argmaxes, live)
                host = (torch.cat([block[:, 1:], argmaxes], dim=1) if K else argmaxes).cpu().tolist()
            else:
                host, warped = self._judge_sampled(block, out.logits, q, room, [r if x else None for r, x in zip(rng, live)])
            if K and not self.schedule.scheduled and (conf is not None or self.confidence_fn is not None):
                conf_host = self._confidences(conf, live)  # recorded for calibration, read after the round's copy
            kept, advance, appended = [1] * B, [0] * B, [[] for _ in range(B)]
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
                                                    p=warped[b].clone(), q=q[b, :n].clone(), accepted=raw,
                                                    room=unscheduled[b], confidence=conf_host[b]))
                    res = settle_round(drafted, nexts, raw, remaining, self.eos, proposals=K)
                else:
                    argmax = host[b][K:K + n + 1]
                    if self.accept_fn is None:
                        raw = greedy_count(drafted, argmax)
                    else:
                        raw = min(int(self.accept_fn(torch.tensor(drafted), torch.tensor(argmax))), n)
                    res = settle_round(drafted, argmax, raw, remaining, self.eos, proposals=K)
                kept[b] = advance[b] = res.commit
                appended[b] = res.tokens
                g.tokens.extend(res.tokens)
                g.accepted.append(res.accepted)
                g.horizons.append(res.horizon)
                g.committed.append(len(res.tokens))
                if K:
                    g.verified.append(n)
                    if conf_host[b] is not None:
                        g.confidence.append([round(c, 6) for c in conf_host[b]])
                seqs[b].extend(res.tokens)
                slot_rounds[b] += 1
                if res.eos:
                    g.stop = "eos"
                if res.eos or len(g.tokens) >= budgets[i]:
                    ended.append(b)
            slots.commit(out, kept, advance, appended)
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
            admit(ended)
        sync(dev)
        end = time.perf_counter()
        bar.close()
        done = [g for g in gens if g is not None]
        if done and end > mark:  # the final synchronisation, charged to every generation alike
            for g in done:
                g.wall_s += (end - mark) / len(done)
        return BatchResult(generations=done, batch_size=B, wall_s=end - t0 - off_clock, rounds=rounds,
                           slot_rounds=slot_rounds, traces=[traces[i] for i, g in enumerate(gens) if g is not None],
                           verify_tokens=verify_tokens)

    def _judge_sampled(self, block: torch.Tensor, logits: torch.Tensor, q: Optional[torch.Tensor], room: list[int],
                       rng: list[Optional[torch.Generator]]) -> tuple[list[list[int]], dict[int, torch.Tensor]]:
        """Each decoding slot's (one with a generator in `rng`) block under the speculative sampling rule with
        its own K + 1 uniforms (1 for an AR step), against its own verify logits -> (per slot [K drafts, A,
        next token] on the host, the slots' warped target distributions p [n + 1, V]); all slots in one batched
        pass (`speculative_rounds`), one host->device copy of their uniforms, one device->host copy of the
        results. Logits of a block verified short (one slot's last round) are padded with copies of its last
        position, which the rule never reads (n[b] limits it)."""
        K, dev = self.k, self.device
        T, top_p = self.sampling.temperature, self.sampling.top_p
        acc = torch.zeros(self.batch_size, dtype=torch.long, device=dev)
        nxt = torch.zeros(self.batch_size, dtype=torch.long, device=dev)
        warped: dict[int, torch.Tensor] = {}
        live = [b for b, gen in enumerate(rng) if gen is not None]
        if live:
            idx = torch.tensor(live, device=dev)
            u = torch.stack([torch.rand(K + 1 if K else 1, generator=rng[b], dtype=torch.float32) for b in live]).to(dev)
            if not K:  # AR: one draw a slot
                nxt[idx] = draw(warp(logits[idx, 0], T, top_p), u[:, 0])
            else:
                if logits.shape[1] < K + 1:
                    logits = torch.cat([logits, logits[:, -1:].expand(-1, K + 1 - logits.shape[1], -1)], dim=1)
                p = warp(logits[idx], T, top_p)
                n = torch.tensor([room[b] for b in live], device=dev)
                acc[idx], nxt[idx] = speculative_rounds(p, q[idx], block[idx, 1:], u[:, :K], u[:, K], n)
                warped = {b: p[i, :room[b] + 1] for i, b in enumerate(live)}
        host = torch.cat([block[:, 1:], acc[:, None], nxt[:, None]], dim=1).cpu().tolist()
        return host, warped


def generate(target: Any, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int,
             drafter: Optional[Drafter] = None, eos_token_id: Optional[int] = None,
             donor: Optional[Sequence[int] | torch.Tensor] = None, sampling: Optional[SamplingParams] = None,
             seed: Optional[int] = None) -> Generation:
    """One-off generation of one prompt (AR without a drafter, speculative with one): greedy, or sampled."""
    return Engine(target, drafter, eos_token_id=eos_token_id, sampling=sampling).generate(
        prompt, max_new_tokens, donor=donor, seed=seed)


def generate_batch(target: Any, prompts: Sequence[Sequence[int] | torch.Tensor], max_new_tokens: int | Sequence[int],
                   drafter: Optional[Drafter] = None, batch_size: Optional[int] = None,
                   eos_token_id: Optional[int] = None) -> list[Generation]:
    """One-off greedy generation of many prompts: `batch_size` slots (default: one per prompt)."""
    engine = Engine(target, drafter, batch_size=batch_size or len(prompts), eos_token_id=eos_token_id)
    return engine.decode(prompts, max_new_tokens).generations


__all__ = ["BatchResult", "Engine", "SLOTS", "generate", "generate_batch"]
