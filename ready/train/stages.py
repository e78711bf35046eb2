"""One training stage of a drafter against the frozen target: base, stage1, or stage2.

- `base`:   DSpark from scratch: every drafter parameter except the target's shared,
            frozen embeddings and LM head (plus the reader's, if the drafter has one); a
            drafter with a confidence head trains it with DSpark's loss for it
            (`train.loss.confidence_weight`, ready.train.loss), as DeepSpec's trainer does.
- `stage1`: ReaDy stage 1: the reader only; the drafter is frozen.
- `stage2`: ReaDy stage 2: the reader plus LoRA adapters on the drafter backbone (peft).

ReaDy's stages leave a confidence head as the base drafter left it, as the paper does (its loss
term is dropped, its weights are not trainable: `trains_confidence`); so does the FT control.

The no-state control (Table 2, `reader.enabled=false`) runs the same two stages with the
same budgets, and LoRA is the only thing it can train: stage 1 trains LoRA adapters with
stage 1's budget (samples, lr, batch, schedule), they are merged, and stage 2 trains fresh
adapters with stage 2's budget. So the control sees exactly as many samples and optimizer
steps as ReaDy; the only difference is state access (and that its stage-1 updates land in
the backbone rather than in a reader).

Each step: sample a batch (a deterministic function of seed, stage and step; with
`train.length_buckets` > 0 rows of similar length go together and the batch is cut to its longest
row, ready.train.batches), sample anchors in the response part, ask the frozen target for context
features, teacher logits (and the committed GDN states at anchors-1 when the drafter reads state;
ready.train.teacher_pass, shared by the rows of a worker that train on the same batches; for a
drafter that reads no state, the rows of a teacher store when one is given and serves it,
ready.train.teacher_store), run the drafter's training forward, and minimise L_CE + λ L_L1
(ready.train.loss). AdamW on fp32 master weights, linear warmup then cosine decay, gradient
clipping, bf16 autocast on CUDA. Every
`train.checkpoint_every` steps (and at the end) the trainable weights, optimizer, scheduler,
RNG and step are saved atomically in `out_dir/checkpoint.pt`; calling the stage again with
the same inputs resumes from there and ends with the same weights as an uninterrupted run.

Data-parallel (ready.train.distributed, started by torchrun): every rank draws the same global
batch (sequence ids and anchors), takes its contiguous slice of it, and DDP sums the ranks'
gradients of their loss shares (ready.train.loss), so N ranks give one process's loss curve
and weights up to floating-point rounding. Rank 0 alone shows progress, calls the callback and
writes checkpoints; a checkpoint holds no trace of N, so a stage resumes with any number of
ranks. The state placebo rolls states within each rank's slice (row b reads row b+1 of the same
slice, its last row the slice's first), so its batches pair rows differently for different N.

Gradient accumulation (`train.micro_batch_size` = M > 0; 0 = each process's slice in one pass):
a process's slice runs in micro-batches of at most M sequences (teacher pass, forward, backward
each; with length buckets each is cut to its own longest row), their gradients accumulate, then
one clip and one optimizer step. The loss is normalised by the whole global batch's weight sum,
known from the anchors' mask before any forward (ready.train.loss.loss_share), so the accumulated
gradient is the one-pass gradient up to rounding, and the logged numbers are the whole batch's.
Under DDP every micro-batch but the last runs in `no_sync()`. Like N, M is in no artifact key or
checkpoint fingerprint; the state placebo rolls states within each micro-batch (so it pairs rows
differently for different M, and M = 1 is refused: a micro-batch needs a second row).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf
from torch import nn
from tqdm.auto import tqdm

from ready.artifacts import atomic_torch_save
from ready.config import config_hash, to_container
from ready.train import distributed
from ready.train.anchors import gather_blocks, sample_anchors
from ready.train.batches import BatchSampler, batch_width
from ready.train.lora import has_lora, inject_lora, lora_parameters
from ready.train.loss import STATS, draft_loss, loss_share, position_weight_sum, terms_from_stats
from ready.train.regen import RegenData
from ready.train.teacher_pass import reads_shuffled_states, teacher_pass
from ready.train.teacher_store import TeacherStore

STAGES = ("base", "stage1", "stage2")
CHECKPOINT = "checkpoint.pt"
MetricsCallback = Callable[[str, float, int], None]


class TrainStageError(ValueError):
    """A stage asked for something the drafter/config cannot do; the message says what."""


@dataclass
class TrainResult:
    """What a stage did: its budget, its loss curve, and which parameters it trained."""

    stage: str
    steps: int
    samples: int
    trainable: list[str] = field(default_factory=list)  # parameter names (as in the trained module)
    losses: list[float] = field(default_factory=list)  # per step
    resumed_from: int = 0  # step the run resumed at (0 = fresh)
    seconds: float = 0.0
    skipped: bool = False

    @property
    def first_loss(self) -> float:
        return _window_mean(self.losses[: max(1, len(self.losses) // 10)])

    @property
    def last_loss(self) -> float:
        return _window_mean(self.losses[-max(1, len(self.losses) // 10) :])


def _window_mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


# --- what a stage trains -----------------------------------------------------------------------

def length_buckets(cfg: Any) -> int:
    """`train.length_buckets`: 0 = random full-width batches, N > 0 = length-bucketed batches cut to their
    longest row (ready.train.batches). A config that predates the key has it at its schema default."""
    return int(cfg.train.length_buckets)


def micro_batch_size(cfg: Any) -> int:
    """`train.micro_batch_size`: 0 = each process's share of a batch in one forward/backward, M > 0 = in
    micro-batches of at most M sequences, gradients accumulated."""
    return int(cfg.train.micro_batch_size)


def micro_batches(n: int, size: int, pairs: bool = False) -> list[slice]:
    """Row slices of a share of `n` rows: one slice of all of them when `size` is 0 or >= n, else
    consecutive slices of at most `size` rows. `pairs` (the state placebo, which needs a second row
    in every pass): a lone last row joins the slice before it (size + 1 rows)."""
    if size <= 0 or size >= n:
        return [slice(0, n)]
    cuts = list(range(0, n, size)) + [n]
    if pairs and cuts[-1] - cuts[-2] == 1:
        del cuts[-2]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:])]


def stage_seed(seed: int, stage: str) -> int:
    return int(seed) * 1000 + STAGES.index(stage) + 1


def reader_on(drafter: Any) -> bool:
    return len(list(drafter.reader_parameters())) > 0


def select_trainable(stage: str, drafter: nn.Module, cfg: Any) -> list[tuple[str, nn.Parameter]]:
    """Set requires_grad for `stage` (injecting LoRA where it needs it); returns the trainable
    (name, parameter) pairs in a fixed order."""
    if stage not in STAGES:
        raise TrainStageError(f"unknown training stage {stage!r}; expected one of {list(STAGES)}")
    has_reader = reader_on(drafter)
    if stage == "base":
        wanted = {id(p) for p in drafter.backbone_parameters()} | {id(p) for p in drafter.reader_parameters()}
    elif stage == "stage1" and has_reader:
        wanted = {id(p) for p in drafter.reader_parameters()}
    else:  # stage2, or stage1 of the no-state control: LoRA (+ reader when there is one)
        if not has_lora(drafter):  # a drafter that already carries adapters keeps training them
            inject_lora(drafter, cfg.train.lora)
        wanted = {id(p) for _, p in lora_parameters(drafter)} | {id(p) for p in drafter.reader_parameters()}
    out = []
    for name, p in drafter.named_parameters():
        p.requires_grad_(id(p) in wanted)
        if id(p) in wanted:
            out.append((name, p))
    if not out:
        raise TrainStageError(f"stage {stage!r} finds no parameter to train in the drafter")
    return out


# --- optimisation -----------------------------------------------------------------------------

def num_steps(samples: int, batch_size: int) -> int:
    """Optimizer steps for a budget of `samples` training sequences (last batch rounded up)."""
    return int(math.ceil(int(samples) / max(1, int(batch_size))))


def warmup_cosine(step: int, total: int, warmup: float) -> float:
    """LR multiplier: linear warmup over `warmup`·total steps, then cosine decay to 0."""
    w = int(round(warmup * total))
    if step < w:
        return (step + 1) / (w + 1)
    t = (step - w) / max(1, total - w)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def make_optimizer(params: list[tuple[str, nn.Parameter]], sc: Any) -> torch.optim.AdamW:
    """AdamW on the fp32 parameters; no weight decay on vectors (norms, biases)."""
    decay = [p for _, p in params if p.dim() >= 2]
    plain = [p for _, p in params if p.dim() < 2]
    groups = [g for g in ({"params": decay, "weight_decay": float(sc.weight_decay)}, {"params": plain, "weight_decay": 0.0}) if g["params"]]
    return torch.optim.AdamW(groups, lr=float(sc.lr), betas=(0.9, 0.95), eps=1e-8)


# --- checkpoints ------------------------------------------------------------------------------

def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trains_confidence(stage: str, cfg: Any, params: list[tuple[str, nn.Parameter]]) -> bool:
    """Whether this stage trains DSpark's confidence head with its loss: the base drafter's training of a
    drafter that has one, at train.loss.confidence_weight > 0. ReaDy's stages (and the FT control's) leave
    it as the base drafter left it, as the paper does: its loss term is dropped and its weights are not
    trainable there (stage 1 trains the reader, stage 2 the reader and LoRA on the draft layers)."""
    weight = float(cfg.train.loss.confidence_weight)
    return stage == "base" and weight > 0 and any(n.startswith("confidence_head.") for n, _ in params)


def _fingerprint(stage: str, cfg: Any, params: list[tuple[str, nn.Parameter]], data: RegenData, seed: int) -> str:
    sc = getattr(cfg.train, stage)
    head = trains_confidence(stage, cfg, params)
    label_t = float(cfg.train.loss.confidence_temperature)  # 1: every checkpoint's before the knob
    key = {
        "stage": stage,
        "stage_cfg": to_container(sc) if OmegaConf.is_config(sc) else dict(vars(sc)),
        "loss": [float(cfg.train.loss.l1_weight), float(cfg.train.loss.decay_gamma)]
        + ([float(cfg.train.loss.confidence_weight)] if head else []) + ([label_t] if head and label_t != 1.0 else []),
        "lora": [int(cfg.train.lora.rank), int(cfg.train.lora.alpha), float(cfg.train.lora.dropout)],
        "params": [(n, list(p.shape)) for n, p in params],
        "data": [len(data), int(data.tokens.shape[1]), int(data.tokens.sum())],
        "seed": seed,
    }
    if length_buckets(cfg):  # absent at 0, so checkpoints written before the knob still resume
        key["length_buckets"] = length_buckets(cfg)
    return config_hash(key)


def save_checkpoint(path: Path, step: int, params, opt, sched, losses: list[float], fingerprint: str) -> None:
    atomic_torch_save(
        {
            "step": step,
            "params": {n: p.detach().cpu().clone() for n, p in params},
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": _rng_state(),
            "losses": list(losses),
            "fingerprint": fingerprint,
        },
        path,
    )


def resume(path: Path, params, opt, sched, fingerprint: str) -> Optional[dict]:
    """`load_checkpoint` for every rank: rank 0 decides whether (and from which step) the stage
    resumes; the others then read the same file, which must be on a filesystem they all see."""
    w = distributed.world()
    if not w.active:
        return load_checkpoint(path, params, opt, sched, fingerprint)
    ck = load_checkpoint(path, params, opt, sched, fingerprint) if w.main else None
    step = distributed.main_decides(lambda: int(ck["step"]) if ck else -1)
    if w.main or step < 0:
        return ck
    ck = load_checkpoint(path, params, opt, sched, fingerprint)
    if ck is None or int(ck["step"]) != step:
        raise TrainStageError(f"rank {w.rank} cannot read the checkpoint {path} that rank 0 resumes from (step {step}); "
                              "expected the stage's folder on a filesystem every rank shares (artifacts_dir)")
    return ck


def load_checkpoint(path: Path, params, opt, sched, fingerprint: str) -> Optional[dict]:
    """Restore a matching checkpoint in place; None when there is none or it is for other inputs.

    The file sits under `artifacts_dir`, which several hosts may share: it is read as data only
    (`weights_only=True`), so a planted pickle is refused like a truncated file, never executed."""
    if not path.is_file():
        return None
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ck, dict):
            raise ValueError("not a checkpoint dict")
    except Exception as e:  # truncated or overwritten: training starts over instead of failing every run
        tqdm.write(f"ignoring unreadable checkpoint {path} ({type(e).__name__}); this stage starts over")
        path.unlink(missing_ok=True)
        return None
    if ck.get("fingerprint") != fingerprint:
        tqdm.write(f"ignoring checkpoint {path}: it was written for another stage config, drafter or data")
        return None
    with torch.no_grad():
        for n, p in params:
            p.copy_(ck["params"][n].to(p.device, p.dtype))
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    _set_rng_state(ck["rng"])
    return ck


# --- evaluation -------------------------------------------------------------------------------

@torch.no_grad()
def evaluate_loss(drafter: nn.Module, target: nn.Module, data: RegenData, cfg: Any, num: int = 64,
                  anchors_per_sample: int = 8, seed: int = 0) -> float:
    """Loss of the drafter on the first `num` sequences of `data` with fixed anchors (no update)."""
    K = int(drafter.proposals)
    idx = torch.arange(min(num, len(data)))
    device = next(drafter.parameters()).device
    tokens = data.tokens[idx].to(device)
    anchors, mask = sample_anchors(data.trainable(idx), K, anchors_per_sample,
                                   torch.Generator().manual_seed(seed))
    anchors, mask = anchors.to(device), mask.to(device)
    was_training = drafter.training
    drafter.eval()
    tp = teacher_pass(target, drafter, tokens, anchors)
    logits = drafter.forward_train(tokens, tp.hidden, anchors, tp.states)
    terms = draft_loss(logits, gather_blocks(tokens, anchors, K, 1), tp.teacher(anchors, K), mask,
                       float(cfg.train.loss.l1_weight), float(cfg.train.loss.decay_gamma))
    drafter.train(was_training)
    return float(terms.loss)


# --- the stage --------------------------------------------------------------------------------

def train_stage(
    stage: str,
    drafter: nn.Module,
    target: nn.Module,
    data: RegenData,
    cfg: Any,
    out_dir: str | Path,
    callback: Optional[MetricsCallback] = None,
    progress: bool = True,
    store: Optional[TeacherStore] = None,
    checkpoints: bool = True,
) -> TrainResult:
    """Train `drafter` in place for one stage (see module doc); checkpoints go to `out_dir`.

    For stages that use LoRA the adapters stay injected (merge them with
    `ready.train.lora.merge_lora_` before saving). The callback receives
    (`train/<stage>/<metric>`, value, step) after every optimizer step. `store`: a teacher store
    whose rows give the teacher passes where they equal them bit for bit (`TeacherStore.serves`);
    ignored elsewhere. `checkpoints=False`: no resumable checkpoint is read or written (benchmarks:
    at paper scale one is tens of GB that nothing keeps).
    """
    if stage not in STAGES:
        raise TrainStageError(f"unknown training stage {stage!r}; expected one of {list(STAGES)}")
    sc = getattr(cfg.train, stage)
    seed = stage_seed(int(cfg.train.base_seed) if stage == "base" else int(cfg.seed), stage)
    torch.manual_seed(seed)
    params = select_trainable(stage, drafter, cfg)
    names = [n for n, _ in params]
    steps = num_steps(sc.samples, sc.batch_size)
    if steps == 0:
        return TrainResult(stage=stage, steps=0, samples=0, trainable=names, skipped=True)
    if len(data) == 0:
        raise TrainStageError("training data is empty; expected regenerated sequences (regen.num_samples > 0)")

    dp = distributed.world()
    if int(sc.batch_size) < dp.size:
        raise TrainStageError(f"train.{stage}.batch_size={sc.batch_size} is smaller than the {dp.size} data-parallel "
                              f"processes; expected at least one sequence per process (batch_size >= {dp.size})")
    rows = distributed.shard(int(sc.batch_size), dp)  # this rank's slice of every global batch
    micro = micro_batch_size(cfg)
    shuffled = reads_shuffled_states(drafter)
    if micro < 0:
        raise TrainStageError(f"train.micro_batch_size={micro}; expected an integer >= 0 (0 = each process's share of "
                              "the batch in one pass)")
    if micro == 1 and shuffled:
        raise TrainStageError("train.micro_batch_size=1 with reader.states=shuffled: the state placebo reads another "
                              "sequence's states from the same pass, so a micro-batch needs at least 2 sequences; "
                              "expected train.micro_batch_size >= 2 (or 0)")
    # accumulate when any rank's slice splits; then every rank takes that path (the same collectives)
    B = int(sc.batch_size)
    shares = [(r + 1) * B // dp.size - r * B // dp.size for r in range(dp.size)]  # every rank's slice size
    accumulate = any(len(micro_batches(n, micro, pairs=shuffled)) > 1 for n in shares)

    device = next(drafter.parameters()).device
    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()
    drafter.train()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    )
    opt = make_optimizer(params, sc)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, float(sc.warmup)))
    out_dir = Path(out_dir)
    if checkpoints:
        out_dir.mkdir(parents=True, exist_ok=True)
    ck_path = out_dir / CHECKPOINT
    fingerprint = _fingerprint(stage, cfg, params, data, seed)
    ck = resume(ck_path, params, opt, sched, fingerprint) if checkpoints else None
    start = int(ck["step"]) if ck else 0
    losses: list[float] = list(ck["losses"]) if ck else []
    head = trains_confidence(stage, cfg, params)  # DSpark's confidence-head loss (the base drafter only)
    conf_weight = float(cfg.train.loss.confidence_weight) if head else 0.0
    conf_temperature = float(cfg.train.loss.confidence_temperature)  # the label's decoding
    ddp = _ddp(drafter, device, accumulate, head) if dp.active else None
    forward = ddp if ddp is not None else (lambda *a: drafter.forward_train(*a, confidence=head))
    reduce = distributed.all_reduce_sum if dp.active else None

    K = int(drafter.proposals)
    trainable = [p for _, p in params]
    every = max(1, int(cfg.train.checkpoint_every))
    l1_weight, gamma = float(cfg.train.loss.l1_weight), float(cfg.train.loss.decay_gamma)

    buckets = length_buckets(cfg)
    sampler = BatchSampler(len(data), int(sc.batch_size), seed, data.lengths, buckets)
    if store is not None and (buckets or not store.serves(target, drafter, data, int(sc.batch_size))):
        store = None  # a batch cut to its longest row is not a stored full-width row bit for bit

    def pass_(idx: torch.Tensor, anchors: torch.Tensor, mask: torch.Tensor) -> tuple[Any, ...]:
        """Teacher pass and drafter forward on rows `idx` (the share, or one micro-batch of it):
        (draft logits, labels, teacher logits, mask, confidence logits or None), on the device."""
        tokens = data.tokens[idx]
        if buckets:  # cut to these rows' longest row: right padding, causal models (ready.train.batches)
            tokens = tokens[:, :batch_width(data, idx, anchors)]
        tokens = tokens.to(device)
        anchors, mask = anchors.to(device), mask.to(device)
        tp = store.teacher_pass(target, idx, anchors) if store is not None else None
        if tp is None:
            tp = teacher_pass(target, drafter, tokens, anchors, keep=stage != "base")  # one base per seed
        labels = gather_blocks(tokens, anchors, K, offset=1)
        teacher = tp.teacher(anchors, K)
        with autocast:
            out = forward(tokens, tp.hidden, anchors, tp.states)
        logits, conf = out if head else (out, None)
        return logits, labels, teacher, mask, conf

    t0 = time.perf_counter()
    bar = tqdm(range(start, steps), desc=f"train {stage}", unit="step", initial=start, total=steps,
               disable=not (progress and dp.main))
    for step in bar:
        idx = sampler(step)
        gen = torch.Generator().manual_seed(seed * 104729 + step)
        anchors, mask = sample_anchors(data.trainable(idx), K, int(sc.anchors_per_sample), gen)
        idx, anchors, mask = idx[rows], anchors[rows], mask[rows]  # the whole batch for one process
        opt.zero_grad(set_to_none=True)
        if not accumulate:  # the whole share in one pass
            logits, labels, teacher, mask_, conf = pass_(idx, anchors, mask)
            terms = draft_loss(logits, labels, teacher, mask_, l1_weight, gamma, all_reduce=reduce,
                               confidence_logits=conf, confidence_weight=conf_weight,
                               confidence_temperature=conf_temperature)
            # DDP averages the ranks' gradients; the shares' gradients must be summed: scale by N
            (terms.loss * dp.size if dp.active else terms.loss).backward()
        else:  # micro-batches: each normalised by the whole batch's weight sum, gradients accumulated
            weight_sum = position_weight_sum(mask.to(device), gamma)
            if reduce is not None:
                weight_sum = reduce(weight_sum.reshape(1))[0]
            total, stats = torch.zeros((), device=device), torch.zeros(STATS, device=device)
            parts = micro_batches(len(idx), micro, pairs=shuffled)
            for i, part in enumerate(parts):
                last = i == len(parts) - 1  # DDP: the ranks' gradients are summed in the last backward only
                with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():
                    logits, labels, teacher, mask_, conf = pass_(idx[part], anchors[part], mask[part])
                    share, part_stats = loss_share(logits, labels, teacher, mask_, weight_sum, l1_weight, gamma,
                                                   confidence_logits=conf, confidence_weight=conf_weight,
                                                   confidence_temperature=conf_temperature)
                    (share * dp.size if dp.active else share).backward()
                total = total + share.detach()
                stats = stats + part_stats
                del logits, labels, teacher, share, conf  # this micro-batch's activations go before the next one's
            if reduce is not None:
                stats = reduce(stats)
            terms = terms_from_stats(total, stats, l1_weight, conf_weight)
        gnorm = torch.nn.utils.clip_grad_norm_(trainable, float(sc.grad_clip))
        opt.step()
        lr = opt.param_groups[0]["lr"]
        sched.step()
        loss = terms.value
        losses.append(loss)
        done = step + 1
        if checkpoints and dp.main and (done % every == 0 or done == steps):
            save_checkpoint(ck_path, done, params, opt, sched, losses, fingerprint)
        bar.set_postfix(loss=f"{loss:.3f}", acc=f"{terms.accuracy:.2f}")
        if callback is not None and dp.main:
            for key, value in (
                ("loss", loss),
                ("ce", terms.ce),
                ("l1", terms.l1),
                ("accuracy", terms.accuracy),
                ("tau_hat", terms.tau_hat),
                ("lr", lr),
                ("grad_norm", float(gnorm)),
                *((("confidence", terms.confidence), ("confidence_error", terms.confidence_error)) if head else ()),
            ):
                callback(f"train/{stage}/{key}", float(value), done)
    bar.close()
    drafter.eval()
    return TrainResult(
        stage=stage,
        steps=steps,
        samples=int(sc.samples),
        trainable=names,
        losses=losses,
        resumed_from=start,
        seconds=time.perf_counter() - t0,
    )


class _TrainForward(nn.Module):
    """The drafter's `forward_train` as a module's `forward`: DDP hooks `forward` only."""

    def __init__(self, drafter: nn.Module, confidence: bool = False):
        super().__init__()
        self.drafter, self.confidence = drafter, confidence

    def forward(self, tokens, hidden, anchors, states):  # noqa: D102
        return self.drafter.forward_train(tokens, hidden, anchors, states, confidence=self.confidence)


def _ddp(drafter: nn.Module, device: torch.device, accumulate: bool = False, confidence: bool = False) -> nn.Module:
    """The drafter's training forward under DistributedDataParallel (gradients summed over ranks
    in buckets while the backward runs). Building it copies rank 0's weights to every rank.
    static_graph: every step reaches the same parameters, and a trainable tensor that a
    configuration never reaches (e.g. a part used only while drafting) must not stall the reduction.
    `accumulate` (micro-batches under `no_sync`): find_unused_parameters instead, which does the same
    for the unreached tensor; static_graph with no_sync fails in torch (pytorch/pytorch#143580)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    if accumulate:
        return DistributedDataParallel(_TrainForward(drafter, confidence), device_ids=ids, find_unused_parameters=True)
    return DistributedDataParallel(_TrainForward(drafter, confidence), device_ids=ids, static_graph=True)
