"""The one config schema: every knob of a ReaDy run, typed, with its single default, and the one
loader every entry point builds its config with.

`load_config` merges schema <- experiments/base.yaml <- presets/<preset>.yaml <- config files (a
sweep's `config:`) <- profiles/<profile>.yaml `config:` <- `a.b=v` overrides <- named layers (a sweep
row), then resolves and validates the result. Unknown keys and wrong types fail at load with the
key's full path and the layer that set it. Each section lives in the dataclass named after it, so
`reader.rank` is `ReaderConfig.rank`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import hashlib
import inspect
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

# the YAML layers (base.yaml, presets/, profiles/, one spec per sweep) beside the package
EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"


@dataclass
class TargetConfig:
    """The hybrid linear-attention target (frozen throughout)."""

    # preset name (`tiny`, `qwen3_5_27b`) or a local Hugging Face checkpoint directory
    source: str = "tiny"
    # when true and `source` is a preset, pretrain it on the embedded corpus first
    pretrain: bool = True
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    # the target's full-attention layers see only the last W tokens (pretrained so); 0 = all (Qwen3.5).
    # A small W puts what the target knows of older text into its GDN states: the positive control
    attention_window: int = 0
    # torch.compile of the target's layers inside its CUDA graphs (fuses a decode step's many small
    # kernels; compiles once per block length during warm-up): auto = on CUDA | on | off
    compile: str = "auto"


@dataclass
class PretrainConfig:
    """Pretraining of the embedded tiny target on the embedded corpus (CPU, minutes)."""

    # sized for ~9 minutes on 2 idle CPU cores (~1.25 CPU-s per 4x256 step on one core):
    # 640 x 4 x 256 = 655k tokens. lr: full runs gave held-out loss 4.76 (3e-3) vs 4.89 (1.5e-3)
    steps: int = 640
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of steps with linear warmup, then cosine decay
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    heldout_windows: int = 64  # seq_len windows of the held-out split for the held-out loss
    sample_tokens: int = 48  # greedy continuation of a held-out prompt stored with the metrics
    seed: int = 0
    repeat_fraction: float = 0.0  # share of windows with a span of their own text repeated (towards copying)
    # share of windows cut from the corpus's conversations (ready.data.stdlib_chats) rendered
    # with the chat template, so the target answers chat prompts as evaluation and training pose them
    chat_fraction: float = 0.5


@dataclass
class CorpusConfig:
    """Text corpus: the sources of the pinned sympy, the same bytes on every install (ready.data.corpus)."""

    vocab_size: int = 4096
    heldout_fraction: float = 0.05
    # the first files of the corpus manifest in sorted path order: 500 = 9.5 MB, near the 9.5 MB of
    # the Python 3.11 standard library the corpus was until issue 78
    max_files: int = 500
    max_file_kb: int = 256  # larger files (generated tables) are skipped
    seed: int = 0


@dataclass
class RegenConfig:
    """Training data: prompts whose responses the target regenerates greedily."""

    # sized with train.base so the embedded default's whole `rank` sweep stays well under 30 min on 2 cores
    num_samples: int = 1000
    # prompt + response lengths match bench.max_prompt_tokens + eval.max_new_tokens, so training
    # anchors sit at the positions evaluation drafts at (`length_mismatch` reports any gap)
    prompt_len: int = 128
    response_len: int = 48
    batch_size: int = 64  # prompts decoded together while regenerating
    seed: int = 0
    # sampling of regenerated conversation turns (data.path): 0 = greedy; DeepSpec samples at 0.7
    temperature: float = 0.0
    top_p: float = 1.0


@dataclass
class DataConfig:
    """Training conversations: a dataset file whose assistant turns the target answers anew (issue 42)."""

    # a conversation dataset (a file, a folder or a glob: JSON, JSON Lines (.gz) or parquet); null = the
    # embedded default's conversations made from the corpus (ready.data.stdlib_chats)
    path: Optional[str] = None
    format: str = "auto"  # auto | sharegpt | messages | perfectblend | prompt_response (auto: from the rows)
    on_error: str = "stop"  # stop: the first malformed row is an error | skip: skip and count it (logged)
    # regenerate: every assistant turn answered anew by the target (the paper's recipe; sampled when
    # regen.temperature > 0) | original: the dataset's own answers (the ablation of regeneration)
    responses: str = "regenerate"


@dataclass
class DrafterConfig:
    """DSpark semi-autoregressive block drafter: its shape in the DSpark checkpoint format's terms.

    `proposals` = K, the tokens the drafter proposes per round (the anchor, the last committed token,
    not counted): a round verifies K + 1 tokens (the anchor + the proposals; fewer under a confidence
    schedule) and commits tau <= K + 1. A DSpark checkpoint's `block_size` counts the anchor: block_size
    = proposals + 1, converted only where a checkpoint is read or written (`ready.drafter.checkpoint`).
    The drafter's layers have their own shape (attention heads, head dim, MLP, rotary), and only
    the hidden size is the target's. The ReaDy reader (`reader:`) is a separate part on top.
    """

    # K, tokens the drafter proposes per round, the anchor not counted: a round verifies K + 1 (7 = the
    # paper's 7 draft positions; the public 27B DSpark checkpoint proposes 6: its block_size 7 counts the anchor)
    proposals: int = 7
    num_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    rope_theta: float = 10000.0
    # Hugging Face rope_scaling of the drafter's own rotary (e.g. {rope_type: yarn, factor: 32,
    # original_max_position_embeddings: 8192}); empty = plain rotary
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    rms_norm_eps: float = 1e-6
    # a real token of the target's vocabulary whose frozen embedding fills the block's mask slots
    # (the embedded tokenizer's <|mask|> is id 1; Qwen3.5's public DSpark uses 248070)
    mask_token_id: int = 1
    # target layers whose hidden features form the drafter's context (paper ids, 64-layer scale);
    # -1 = the token embeddings (features that carry nothing of other tokens)
    context_layers: list[int] = field(default_factory=lambda: [1, 17, 33, 49, 62])
    # vanilla | gated | rnn: DSpark's Markov head over the previous draft token; none: no head, the block's
    # logits are the draft layers' plain LM-head logits (DFlash; head_rank is then not used)
    head: str = "vanilla"
    head_rank: int = 64
    # DSpark's confidence head (a linear acceptance predictor per proposal): trained with the base drafter
    # (DSpark's loss, train.loss.confidence_weight), left as it is by ReaDy's stages (the paper drops its
    # term), saved; eval.verify_schedule: confidence schedules verification with it
    confidence_head: bool = False
    confidence_with_markov: bool = True  # the confidence head also sees the Markov embedding of the previous token
    # a pretrained drafter: this project's folder or a DSpark (SpecForge / DeepSpec) Hugging Face folder;
    # empty = train the base drafter from scratch. Its shape fields replace the ones above
    checkpoint: Optional[str] = None
    # id space of context_layers: "paper" (64-layer ids, mapped by relative depth) | "model" (target ids as given)
    layer_space: str = "paper"
    # the drafter's attention over target features sees only the last W committed tokens; 0 = all
    # (the paper's setting). A small W is the positive control: what lies further back reaches the
    # drafter only through the committed states the reader reads
    context_window: int = 0


@dataclass
class ReaderConfig:
    """ReaDy state reader: position-conditioned reads of the committed GDN states."""

    enabled: bool = True
    rank: int = 8
    # GDN source layers in the paper's 64-layer ids; mapped to the nearest GDN layer at the
    # same relative depth for targets of another depth
    layers: list[int] = field(default_factory=lambda: [30, 62])
    # zero-indexed draft layers the reader is injected into; -1 = the last draft layer
    inject_layers: list[int] = field(default_factory=lambda: [-1])
    position: str = "post"  # post | pre  (relative to the draft layer's attention)
    mlp_hidden: int = 256
    eps: float = 1e-6
    # id space of layers: "paper" (64-layer ids, mapped to the nearest GDN layer) | "model" (GDN ids as given)
    layer_space: str = "paper"
    # own | shuffled. shuffled = the state placebo: the reader is trained and evaluated on the
    # committed states of another sequence (another batch row in training, another prompt at
    # decode), so adapter capacity is matched and state information removed
    states: str = "own"


@dataclass
class LossConfig:
    """L = L_CE + l1_weight * L_L1 with position weights w_j = exp(-j / decay_gamma)."""

    l1_weight: float = 0.1
    decay_gamma: float = 4.0
    # weight of DSpark's confidence-head loss (BCE of the head against the per-position acceptance
    # probability, the same position weights; DeepSpec's confidence_head_alpha, 1.0 in its configs), in the
    # base drafter's training only, when the drafter has a confidence head (ReaDy's stages drop it)
    confidence_weight: float = 1.0
    # the decoding temperature the head's acceptance label assumes (ready.train.loss.confidence_label):
    # 0 = greedy verification, 1{draft argmax = target argmax} (eval.temperature 0); T > 0 = speculative
    # sampling, 1 - TV of the two softmaxes at T (DeepSpec's label at 1, its evaluator's temperature)
    confidence_temperature: float = 0.0


@dataclass
class StageConfig:
    """One training stage's optimisation budget."""

    samples: int = 2000  # training sequences seen (steps = samples / batch_size, rounded up)
    lr: float = 1e-4  # peak learning rate (AdamW, linear warmup then cosine decay to 0)
    # 8 sequences x 32 anchors: on CPU the frozen target's forward is most of a step, so more
    # blocks per sequence buy more training per second (187 vs 121 blocks/s for 16 x 16)
    batch_size: int = 8
    warmup: float = 0.04  # fraction of the steps spent warming up
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # draft blocks sampled per sequence (in its response part): one target forward feeds them all
    anchors_per_sample: int = 32


@dataclass
class LoraConfig:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@dataclass
class TrainConfig:
    """Base DSpark training (from scratch) and ReaDy's two adaptation stages."""

    # CPU-sized budgets for the embedded default (the paper: stage 1 20k samples at 1e-4, stage 2
    # 50k at 5e-5); a GPU run on a real target should scale samples up and lr down
    base: StageConfig = field(default_factory=lambda: StageConfig(samples=1600, lr=2e-3))
    stage1: StageConfig = field(default_factory=lambda: StageConfig(samples=128, lr=1e-3))
    stage2: StageConfig = field(default_factory=lambda: StageConfig(samples=320, lr=5e-4))
    lora: LoraConfig = field(default_factory=LoraConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    checkpoint_every: int = 50  # optimizer steps between resumable checkpoints
    # seed of the base DSpark drafter, which every variant and seed of a sweep shares
    base_seed: int = 0
    # rows of similar length batched together: 0 = off (random batches as wide as the longest row of the
    # data) | N > 0 = rows sorted by length within shuffled chunks of N batches, each batch cut to its
    # longest row (conversations vary in length; docs/sweeps.md "Training data")
    length_buckets: int = 0
    # data-parallel processes (GPUs; gloo processes on CPU); N > 1 trains under torchrun, not hashed
    # (same global batch, same result up to rounding; docs/sweeps.md "GPUs for rows and within a row")
    devices: int = 1
    # gradient accumulation: 0 = each process's share of a batch in one forward/backward | M > 0 = in
    # micro-batches of at most M sequences, gradients summed, one optimizer step; not hashed (same loss
    # and update up to rounding; the state placebo pairs rows within a micro-batch, so it needs M != 1)
    micro_batch_size: int = 0
    # GB of the frozen target's teacher passes a sweep worker keeps for the next row that asks the same
    # (ready.train.teacher_pass; CPU targets up to 1 GB of weights); 0 = off; not hashed (a kept pass is
    # the very tensors a fresh one would compute)
    teacher_memo_gb: float = 4.0


@dataclass
class BenchmarkConfig:
    """Evaluation suites and where their local files live."""

    suites: list[str] = field(default_factory=lambda: ["humaneval", "heldout"])
    # local file per benchmark (JSONL, JSON or parquet in its public format, or a turns file: DeepSpec's
    # eval_datasets/*.jsonl, records with 'turns'); a name outside the seven needs a turns file here
    paths: dict[str, str] = field(default_factory=dict)
    limit: int = 64  # prompts per benchmark (the unit of evidence of every interval)
    thinking: bool = False  # chat template's thinking switch, when the tokenizer has one
    max_prompt_tokens: int = 128
    # first | all: the prompt of a turns file's record. first = its first user turn (as DeepSpec's and
    # MT-Bench's first-turn evaluation pose it); all = every user turn, in order, as consecutive user
    # messages of one chat-template prompt with no assistant turns between them (the files hold no answers
    # and none are generated; a template that insists on alternating roles is refused), joined by blank
    # lines without a template (docs/sweeps.md "DeepSpec's evaluation prompts")
    turns: str = "first"


@dataclass
class EvalConfig:
    """Speculative decoding measurement (greedy, or sampled at temperature > 0), and the cheaper
    teacher-forced measure beside it."""

    # 2 suites x 64 prompts x 40 new tokens: ~17 rounds a prompt, 6 % of them cut by the budget
    # (docs/sweeps.md "How much data a comparison needs"); regen.response_len 48 still covers them
    max_new_tokens: int = 40  # issue 44: 16 -> 40 (~17 rounds a prompt, 6 % budget-cut; MDE: docs/sweeps.md)
    warmup_rounds: int = 1
    # auto | on | off: time AR in the same process as each drafting row, prompt by prompt
    # alternating with it, so speedups are paired (auto = on CUDA; CPU timing is indicative only)
    interleave_ar: str = "auto"
    # every ReaDy row also decodes its prompts with another prompt's states (free: no training)
    # and logs state_reliance = tau with its own states - tau with the other's
    state_reliance: bool = True
    # held-out regenerated sequences (the validation split, regen lengths) on which every drafting
    # row's teacher-forced acceptance `heldout_tf/tau` is measured over every full-block anchor; 0 = off
    heldout_tf_samples: int = 128
    # auto | on | off. exact mode: the target's verify and AR step run row-invariant kernels, so the
    # speculative output equals AR token for token in 16-bit too (lossless_exact); off = the fast path,
    # checked by greedy_valid within a tie margin. auto = on for a bfloat16/float16 target (its cost:
    # docs/figures.md "Exact mode and lossless"), off for float32 (bit-identical there already; exact mode's
    # CPU path is slow) (docs/sweeps.md "Lossless")
    exact: str = "auto"
    # sampling (docs/sweeps.md "Sampling"): 0 = greedy, the paper's setting; > 0 = AR and speculative sampling
    # with the standard acceptance rule (exact in distribution), lossless then = the distribution check
    temperature: float = 0.0
    top_p: float = 1.0  # nucleus mass kept at temperature > 0 (1 = every token)
    # base of the per-(prompt, sample) seeds; every row of a setting draws the same random numbers
    sample_seed: int = 0
    # generations per prompt at temperature > 0 (the intervals treat a prompt with all its samples as one unit)
    samples_per_prompt: int = 4
    # rounds of every sampled generation checked in distribution (rule and target states; 0 = none)
    check_rounds: int = 2
    # sequences decoded together (ready.decode.engine): c > 1 decodes each benchmark's prompts through c
    # slots of one batched engine (AR and drafting rows alike; greedy or sampled), TPS = all committed
    # tokens / wall time at that concurrency; per-prompt rounds and accepted lengths stay per prompt
    # (greedy float32: token for token those of one prompt at a time). 8 on the embedded default (CPU
    # TPS is indicative; it shortens the main job by minutes); 1 = one prompt at a time, the paper's
    # batch-1 latency, which the GPU presets set
    concurrency: int = 8
    # which drafts a round verifies (ready.decode.schedule): full = all of them (the paper's setting) |
    # confidence = the prefix the drafter's confidence head keeps, as DSpark's authors schedule it
    # (DeepSpec, SGLang); needs a confidence head (drafter.confidence_head, or a DSpark checkpoint with one)
    verify_schedule: str = "full"
    # confidence: a row verifies its drafts up to the first whose step confidence is below this (0 = none)
    confidence_threshold: float = 0.5
    # confidence: the batch verifies at most this many drafts per decoding row, those of highest predicted
    # survival (SGLang's top-k budget; 0 = no budget)
    verify_budget: float = 0.0


@dataclass
class ThreadsConfig:
    """torch's CPU threads: CPU sums add in an order that depends on them, so they are part of the numbers."""

    # what every row of a sweep shares: the target's pretraining, AR generations, regenerated data, the
    # teacher store. Hashed into each of them; the machine's load never changes it (docs/sweeps.md "Threads")
    shared: int = 2
    # the base drafters and every row's training stages and evaluation (one process per row; a sweep runs
    # as many rows side by side as the idle cores hold). Hashed likewise
    drafters: int = 1


@dataclass
class Config:
    """A resolved ReaDy run: one variant of one sweep, for one seed."""

    name: str = "default"
    seed: int = 0
    artifacts_dir: str = "artifacts"
    target: TargetConfig = field(default_factory=TargetConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    regen: RegenConfig = field(default_factory=RegenConfig)
    data: DataConfig = field(default_factory=DataConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    bench: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    threads: ThreadsConfig = field(default_factory=ThreadsConfig)


class ConfigError(ValueError):
    """A config the user wrote is wrong; the message names the key and what was expected."""


# Keys removed from the schema: (the value every run before the removal had, why it went). A layer that
# still sets one at that value loads without it (a trial stored before, an old spec file); another value is
# a ConfigError saying why. `restore_retired` puts them back where results are keyed by config (a row's
# hash, a cached evaluation), so the runs and caches made before the removal are still found.
RETIRED: dict[str, tuple[Any, str]] = {
    "eval.use_kernels": (True, "nothing read it: the fused Triton kernels run wherever CUDA and Triton do "
                               "(ready.fastops), and a kernel A/B compares two source trees (benchmarks.ab --tree)"),
}


# Keys renamed in the schema: old key -> (new key in the same section, old value - new value, why). A layer
# that still sets the old key (a queued trial's stored config, an old spec file) loads as the new key, with one
# line on stderr saying so; a layer that sets both is a ConfigError. `restore_retired` hashes the new key under
# its old name and value, so the rows, trained drafters and caches made before the rename are still found
# (tests/test_hash_pins.py).
RENAMED: dict[str, tuple[str, int, str]] = {
    "drafter.block_size": ("drafter.proposals", 1, "DSpark's block_size counts the anchor; the config counts the "
                                                   "tokens proposed per round, block_size = proposals + 1"),
}


def restore_retired(tree: dict, section: str = "") -> dict:
    """`tree` (a config as a nested dict, or its `section`) as hashed before keys left or were renamed: each
    retired key put back at its old value and each renamed key under its old name and value, wherever the
    section holding it is present; for what is hashed, so hashes stay as before the removal or rename."""
    prefix = f"{section}." if section else ""
    for key, (old, _) in RETIRED.items():
        if key.startswith(prefix):
            node = _retired_node(tree, key[len(prefix):])
            if isinstance(node, dict):
                node[key.rsplit(".", 1)[-1]] = old
    for key, (new, offset, _) in RENAMED.items():
        node = _retired_node(tree, new[len(prefix):]) if new.startswith(prefix) else None
        last = new.rsplit(".", 1)[-1]
        if isinstance(node, dict) and last in node:
            node[key.rsplit(".", 1)[-1]] = node.pop(last) + offset
    return tree


def _retired_node(tree: Any, key: str) -> Any:
    """The mapping in `tree` that holds `key`'s last part, or None."""
    *parents, _ = key.split(".")
    for p in parents:
        tree = tree.get(p) if isinstance(tree, (dict, DictConfig)) else None
    return tree if isinstance(tree, (dict, DictConfig)) else None


def _without_retired(layer: Any, source: str) -> Any:
    """`layer` without the retired keys it sets at their old value (a copy; `layer` itself when it sets
    none); another value is a ConfigError naming the key and why it went."""
    for key, (old, why) in RETIRED.items():
        last = key.rsplit(".", 1)[-1]
        node = _retired_node(layer, key)
        if node is None or last not in node:
            continue
        if node[last] != old:
            raise ConfigError(f"{source}: bad value at key '{key}': {node[last]!r}; this key was removed ({why}); "
                              f"expected no such key (or its old value {old!r}, which changes nothing)")
        layer = OmegaConf.to_container(layer, resolve=False) if isinstance(layer, DictConfig) else copy.deepcopy(layer)
        del _retired_node(layer, key)[last]
    return layer


def renamed_keys(layer: Any, source: str, section: str = "", quiet: bool = False) -> Any:
    """`layer` (a config layer, or its `section`) with each renamed key under its new name and value (a copy;
    `layer` itself when it sets none), one line on stderr per key unless `quiet`; a layer that sets both names,
    or the old one to a non-integer, is a ConfigError naming the key."""
    prefix = f"{section}." if section else ""
    for key, (new, offset, why) in RENAMED.items():
        if not key.startswith(prefix):
            continue
        old_last, new_last = key.rsplit(".", 1)[-1], new.rsplit(".", 1)[-1]
        node = _retired_node(layer, key[len(prefix):])
        if node is None or old_last not in node:
            continue
        value = node[old_last]
        if new_last in node:
            raise ConfigError(f"{source}: bad value at key '{key}': {value!r}; this key was renamed {new} ({why}); "
                              f"expected {new} alone")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: bad value at key '{key}': {value!r}; this key was renamed {new} ({why}); "
                              f"expected {new} = an integer")
        layer = OmegaConf.to_container(layer, resolve=False) if isinstance(layer, DictConfig) else copy.deepcopy(layer)
        node = _retired_node(layer, key[len(prefix):])
        node[new_last] = node.pop(old_last) - offset
        if not quiet:
            print(f"config: {source}: {key} = {value} is read as {new} = {value - offset} ({why})",
                  file=sys.stderr, flush=True)
    return layer


MainT = TypeVar("MainT", bound=Callable[..., Any])


def entry_point(main: MainT) -> MainT:
    """The one rule for config errors at every entry point, as a decorator of a command's `main(argv)`: a
    `ConfigError` (a bad key, type, range or config file; its message names the input and the key's full
    path) is one line on stderr, `error: ...`, and exit status 2, never a traceback. It exits by
    SystemExit(2), as argparse does for a bad flag, so `python -m MODULE` and `ready COMMAND` exit alike
    whatever the command's `main` returns (`sweeps/cli.py` applies it to every command it runs, too)."""

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except ConfigError as e:
            text = str(e).strip()
            print(f"error: {text.splitlines()[0] if text else type(e).__name__}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    wrapped.__ready_entry_point__ = True  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


def schema() -> DictConfig:
    """The structured (typed, closed) config with every default."""
    return OmegaConf.structured(Config)


def merge(base: DictConfig, *layers: Any, source: str = "config") -> DictConfig:
    """Merge layers onto a structured config; unknown keys or bad types raise ConfigError."""
    out = base
    for layer in layers:
        try:
            out = OmegaConf.merge(out, layer)
        except Exception as e:  # omegaconf raises several error types; all mean "bad input"
            key = getattr(e, "full_key", None) or ""
            msg = clean_message(getattr(e, "msg", None) or str(e))  # one line, not OmegaConf's block
            raise ConfigError(f"{source}: bad value at key '{key}': {msg}") from None
    return out


SectionT = TypeVar("SectionT")


def section(kind: type[SectionT], value: Any, source: str = "config", key: str = "") -> SectionT:
    """One config section as its dataclass `kind` (`section(DrafterConfig, cfg.drafter)`): what code below the
    loader reads, by attribute. `value` is a loaded config's section (a DictConfig, resolved against the config
    it belongs to), a mapping (a checkpoint's JSON block) or an instance (copied, and typed as a loaded one is);
    every key it leaves out takes the dataclass's default, the one place a default is written. A key `kind`
    has no field for, or a value of the wrong type, is one ConfigError naming `source` and the key's full path
    (`key` is where the section sits in `source`, e.g. `ready_drafter.drafter` of a checkpoint's config.json)."""
    prefix = f"{key}." if key else ""
    try:
        if isinstance(value, DictConfig):
            tree = OmegaConf.to_container(value, resolve=True)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            tree = OmegaConf.to_container(OmegaConf.structured(value), resolve=True)
        else:
            tree = value
        if not isinstance(tree, Mapping):
            raise ConfigError(f"{source}: bad value at key '{key}': {value!r}; expected a mapping of "
                              f"{kind.__name__}'s keys")
        unknown_key(kind, tree, source, prefix)
        typed = OmegaConf.merge(OmegaConf.structured(kind), tree)
        return OmegaConf.to_object(typed)  # type: ignore[return-value]
    except ConfigError:
        raise
    except Exception as e:  # omegaconf raises several error types; all mean "bad input"
        name = getattr(e, "full_key", None) or ""
        msg = clean_message(getattr(e, "msg", None) or str(e))
        raise ConfigError(f"{source}: bad value at key '{prefix}{name}': {msg}") from None


def unknown_key(kind: type, tree: Mapping[str, Any], source: str, prefix: str = "") -> None:
    """A key of `tree` that the dataclass `kind` (or a section nested in it) has no field for: one ConfigError
    naming its full path, the closest field when one is close, and the keys expected there."""
    sample = kind()
    names = [f.name for f in dataclasses.fields(kind)]
    for name, value in tree.items():
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(f"{source}: unknown key '{prefix}{name}'{hint}; expected one of {kind.__name__}'s "
                              f"keys: {', '.join(names)}")
        inner = getattr(sample, name)
        if dataclasses.is_dataclass(inner) and isinstance(value, Mapping):
            unknown_key(type(inner), value, source, f"{prefix}{name}.")


def validate(cfg: DictConfig | Config) -> None:
    """Range checks that types alone cannot express."""
    c = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    trains_head = not c.drafter.checkpoint and c.train.base.samples > 0  # the base drafter's head learns its label here
    checks = [
        ("reader.rank", c.reader.rank >= 1, "a positive integer (1 .. d_k)"),
        ("reader.position", c.reader.position in ("pre", "post"), "'pre' or 'post'"),
        ("drafter.head", c.drafter.head in ("vanilla", "gated", "rnn", "none"),
         "'vanilla', 'gated' or 'rnn' (DSpark's Markov heads) or 'none' (DFlash)"),
        ("drafter.head_rank", c.drafter.head == "none" or c.drafter.head_rank >= 1,
         "an integer >= 1 (the Markov head's rank; drafter.head=none for no head)"),
        ("drafter.confidence_with_markov",
         not (c.drafter.head == "none" and c.drafter.confidence_head and c.drafter.confidence_with_markov),
         "false with drafter.head=none (there is no Markov embedding for the confidence head to read)"),
        ("data.format", c.data.format in ("auto", "sharegpt", "messages", "perfectblend", "prompt_response"),
         "auto, sharegpt, messages, perfectblend or prompt_response"),
        ("data.on_error", c.data.on_error in ("stop", "skip"), "stop or skip"),
        ("data.responses", c.data.responses in ("regenerate", "original"), "regenerate or original"),
        ("regen.temperature", c.regen.temperature >= 0, "a number >= 0 (0 = greedy)"),
        ("regen.top_p", 0 < c.regen.top_p <= 1, "a number in (0, 1]"),
        ("drafter.proposals", c.drafter.proposals >= 1, "an integer >= 1 (tokens proposed per round, the anchor not counted)"),
        ("drafter.num_attention_heads", c.drafter.num_attention_heads >= 1
         and c.drafter.num_attention_heads % max(1, c.drafter.num_key_value_heads) == 0,
         "a positive multiple of drafter.num_key_value_heads"),
        ("drafter.head_dim", c.drafter.head_dim >= 2 and c.drafter.head_dim % 2 == 0, "an even integer >= 2"),
        ("drafter.mask_token_id", c.drafter.mask_token_id >= 0, "a token id >= 0 (a real token of the target)"),
        ("drafter.num_layers", c.drafter.num_layers >= 1, "an integer >= 1"),
        ("drafter.context_window", c.drafter.context_window >= 0, "an integer >= 0 (0 = unlimited)"),
        ("reader.states", c.reader.states in ("own", "shuffled"), "'own' or 'shuffled' (the state placebo)"),
        ("reader.layers", len(c.reader.layers) >= 1, "a non-empty list of layer ids"),
        ("reader.inject_layers", len(c.reader.inject_layers) >= 1, "a non-empty list of draft layer ids"),
        ("train.loss.decay_gamma", c.train.loss.decay_gamma > 0, "a positive number"),
        ("train.loss.l1_weight", c.train.loss.l1_weight >= 0, "a number >= 0"),
        ("train.length_buckets", c.train.length_buckets >= 0, "an integer >= 0 (0 = random full-width batches)"),
        ("train.devices", c.train.devices >= 1, "an integer >= 1 (data-parallel training processes)"),
        ("train.micro_batch_size", c.train.micro_batch_size >= 0,
         "an integer >= 0 (0 = each process's share of a batch in one pass; M > 0 = micro-batches of at most M)"),
        ("train.micro_batch_size",
         c.train.micro_batch_size != 1 or not c.reader.enabled or c.reader.states != "shuffled",
         "0 or >= 2 with reader.states=shuffled (the state placebo reads another sequence of the same pass)"),
        ("eval.max_new_tokens", c.eval.max_new_tokens >= 1, "an integer >= 1"),
        ("eval.heldout_tf_samples", c.eval.heldout_tf_samples >= 0, "an integer >= 0 (0 = no teacher-forced metric)"),
        ("eval.interleave_ar", c.eval.interleave_ar in ("auto", "on", "off"), "auto, on or off"),
        ("eval.exact", str(c.eval.exact).lower() in EXACT_VALUES, "auto, on or off (or true / false)"),
        ("eval.temperature", c.eval.temperature >= 0, "a number >= 0 (0 = greedy)"),
        ("eval.top_p", 0 < c.eval.top_p <= 1, "a number in (0, 1] (1 = no nucleus cut)"),
        ("eval.samples_per_prompt", c.eval.samples_per_prompt >= 1, "an integer >= 1"),
        ("eval.check_rounds", c.eval.check_rounds >= 0, "an integer >= 0 (0 = no distribution check)"),
        ("eval.concurrency", c.eval.concurrency >= 1, "an integer >= 1 (sequences decoded together)"),
        ("eval.verify_schedule", c.eval.verify_schedule in ("full", "confidence"), "full or confidence"),
        ("eval.verify_schedule", c.eval.verify_schedule != "confidence" or c.drafter.confidence_head
         or bool(c.drafter.checkpoint),
         "full with drafter.confidence_head false (the confidence schedule reads the drafter's confidence head)"),
        ("eval.confidence_threshold", 0.0 <= c.eval.confidence_threshold <= 1.0, "a number in [0, 1] (0 = none)"),
        ("eval.verify_budget", c.eval.verify_budget >= 0, "drafts per decoding row >= 0 (0 = no budget)"),
        ("train.loss.confidence_weight", c.train.loss.confidence_weight >= 0, "a number >= 0"),
        ("train.loss.confidence_temperature", c.train.loss.confidence_temperature >= 0, "a number >= 0 (0 = greedy)"),
        ("train.loss.confidence_temperature", c.eval.verify_schedule != "confidence" or not trains_head
         or c.train.loss.confidence_temperature == c.eval.temperature,
         f"eval.temperature ({c.eval.temperature}) with eval.verify_schedule=confidence and a head trained here: the "
         "schedule thresholds the head's predicted acceptance, which must be that of the decoding it schedules "
         "(a head loaded from drafter.checkpoint is used as loaded; one trained 0 steps, train.base.samples=0, was "
         "never labelled)"),
        ("eval.top_p", c.eval.verify_schedule != "confidence" or not trains_head or c.eval.temperature == 0
         or c.eval.top_p == 1.0,
         "1 with eval.verify_schedule=confidence, eval.temperature > 0 and a head trained here (its label, 1 - TV of "
         "the two softmaxes, assumes no nucleus cut: ready.train.loss.confidence_label)"),
        ("threads.shared", c.threads.shared >= 1, "an integer >= 1 (torch CPU threads of the shared builds)"),
        ("threads.drafters", c.threads.drafters >= 1, "an integer >= 1 (torch CPU threads of drafter training "
                                                      "and evaluation)"),
        ("target.dtype", c.target.dtype in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16"),
        ("target.device", c.target.device in ("auto", "cpu", "cuda"), "auto, cpu or cuda"),
        ("target.compile", str(c.target.compile).lower() in COMPILE_VALUES, "auto, on or off"),
        ("train.teacher_memo_gb", c.train.teacher_memo_gb >= 0, "a number of GB >= 0 (0 = no memo)"),
        ("target.attention_window", c.target.attention_window >= 0, "an integer >= 0 (0 = every earlier token)"),
        ("pretrain.repeat_fraction", 0.0 <= c.pretrain.repeat_fraction <= 1.0, "a share in [0, 1]"),
        ("bench.suites", len(c.bench.suites) >= 1, "a non-empty list of benchmark names (e.g. [humaneval, heldout])"),
        ("bench.limit", c.bench.limit >= 1, "an integer >= 1 (prompts per benchmark; a file with fewer records "
                                           "gives all it has)"),
        ("bench.max_prompt_tokens", c.bench.max_prompt_tokens >= 0, "an integer >= 0 (0 = prompts are not cut)"),
        ("bench.turns", c.bench.turns in BENCH_TURNS, "first or all (the prompt of a record with 'turns': its "
                                                       "first user turn, or every user turn)"),
        ("bench.suites", len(set(c.bench.suites)) == len(c.bench.suites),
         "each benchmark once (a suite named twice would be decoded and pooled twice)"),
        ("eval.warmup_rounds", c.eval.warmup_rounds >= 0, "an integer >= 0 (untimed warm-up generations)"),
        ("drafter.num_key_value_heads", c.drafter.num_key_value_heads >= 1, "an integer >= 1"),
        ("drafter.intermediate_size", c.drafter.intermediate_size >= 1, "an integer >= 1"),
        ("drafter.rope_theta", c.drafter.rope_theta > 0, "a positive number"),
        ("drafter.rms_norm_eps", c.drafter.rms_norm_eps > 0, "a positive number"),
        ("drafter.context_layers", len(c.drafter.context_layers) >= 1, "a non-empty list of target layer ids"),
        ("drafter.layer_space", c.drafter.layer_space in LAYER_SPACES, "paper or model"),
        ("reader.layer_space", c.reader.layer_space in LAYER_SPACES, "paper or model"),
        ("reader.mlp_hidden", c.reader.mlp_hidden >= 1, "an integer >= 1"),
        ("reader.eps", c.reader.eps > 0, "a positive number"),
        ("train.lora.rank", c.train.lora.rank >= 1, "an integer >= 1"),
        ("train.lora.alpha", c.train.lora.alpha > 0, "a positive number"),
        ("train.lora.dropout", 0 <= c.train.lora.dropout < 1, "a share in [0, 1)"),
        ("train.checkpoint_every", c.train.checkpoint_every >= 1, "an integer >= 1 (optimizer steps between checkpoints)"),
        ("regen.num_samples", c.regen.num_samples >= 1, "an integer >= 1"),
        ("regen.prompt_len", c.regen.prompt_len >= 1, "an integer >= 1"),
        ("regen.response_len", c.regen.response_len >= 1, "an integer >= 1"),
        ("regen.batch_size", c.regen.batch_size >= 1, "an integer >= 1"),
        ("corpus.heldout_fraction", 0 < c.corpus.heldout_fraction < 1, "a share in (0, 1)"),
        ("corpus.max_files", c.corpus.max_files >= 1, "an integer >= 1"),
        ("corpus.max_file_kb", c.corpus.max_file_kb >= 1, "an integer >= 1"),
        ("pretrain.steps", c.pretrain.steps >= 1, "an integer >= 1"),
        ("pretrain.batch_size", c.pretrain.batch_size >= 1, "an integer >= 1"),
        ("pretrain.seq_len", c.pretrain.seq_len >= 2, "an integer >= 2"),
        ("pretrain.lr", c.pretrain.lr > 0, "a positive number"),
        ("pretrain.warmup", 0 <= c.pretrain.warmup <= 1, "a share of the steps in [0, 1]"),
        ("pretrain.min_lr_ratio", 0 <= c.pretrain.min_lr_ratio <= 1, "a share in [0, 1]"),
        ("pretrain.weight_decay", c.pretrain.weight_decay >= 0, "a number >= 0"),
        ("pretrain.grad_clip", c.pretrain.grad_clip > 0, "a positive number (the gradient norm's bound)"),
        ("pretrain.heldout_windows", c.pretrain.heldout_windows >= 1, "an integer >= 1"),
        ("pretrain.sample_tokens", c.pretrain.sample_tokens >= 0, "an integer >= 0"),
        ("pretrain.chat_fraction", 0.0 <= c.pretrain.chat_fraction <= 1.0, "a share in [0, 1]"),
    ]
    for stage in ("base", "stage1", "stage2"):
        sc = c.train[stage]
        checks += [
            (f"train.{stage}.samples", sc.samples >= 0, "an integer >= 0 (training sequences seen; 0 trains nothing)"),
            (f"train.{stage}.lr", sc.lr > 0, "a positive number"),
            (f"train.{stage}.batch_size", sc.batch_size >= 1, "an integer >= 1"),
            (f"train.{stage}.warmup", 0 <= sc.warmup <= 1, "a share of the steps in [0, 1]"),
            (f"train.{stage}.weight_decay", sc.weight_decay >= 0, "a number >= 0"),
            (f"train.{stage}.grad_clip", sc.grad_clip > 0, "a positive number (the gradient norm's bound)"),
            (f"train.{stage}.anchors_per_sample", sc.anchors_per_sample >= 1, "an integer >= 1"),
        ]
    checks += [(key, seed_ok(OmegaConf.select(c, key)), SEED_RANGE) for key in SEED_KEYS]
    for key, ok, expected in checks:
        if not ok:
            raise ConfigError(f"bad value at key '{key}': {OmegaConf.select(c, key)!r}; expected {expected}")


BENCH_TURNS = ("first", "all")  # bench.turns
LAYER_SPACES = ("paper", "model")  # drafter.layer_space, reader.layer_space
# every seed of a run: the random generators take them (some after a small multiplication), so they are kept
# to 32 bits, where numpy's, Python's and torch's all take them as they are
SEED_MAX = 2**32 - 1
SEED_RANGE = f"an integer seed in [0, {SEED_MAX}]"
SEED_KEYS = ("seed", "train.base_seed", "pretrain.seed", "corpus.seed", "regen.seed", "eval.sample_seed")


def seed_ok(value: Any) -> bool:
    """Whether `value` is a seed every generator of a run takes (SEED_RANGE)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SEED_MAX


EXACT_VALUES = {"auto": None, "on": True, "true": True, "off": False, "false": False}
COMPILE_VALUES = EXACT_VALUES


def compile_in_graphs(cfg: DictConfig | Config) -> Optional[bool]:
    """`target.compile` as the target's `compile_in_graphs`: None = auto (on CUDA), True / False forced."""
    return COMPILE_VALUES[str(cfg.target.compile).lower()]


def exact_mode(cfg: DictConfig | Config) -> bool:
    """`eval.exact` resolved: on / off as given; auto = on for a 16-bit target. Depends on the config
    only (never on the machine), so a row hashes the same everywhere."""
    value = EXACT_VALUES[str(cfg.eval.exact).lower()]
    return cfg.target.dtype in ("bfloat16", "float16") if value is None else value


def length_mismatch(cfg: DictConfig | Config) -> Optional[str]:
    """Why the drafter's training positions miss the positions evaluation drafts at, or None.

    Training anchors lie in the response part of regenerated sequences, positions
    regen.prompt_len - 1 .. regen.prompt_len + regen.response_len - 2; evaluation drafts from the
    end of a prompt of up to bench.max_prompt_tokens tokens for eval.max_new_tokens tokens."""
    c = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    train_end = int(c.regen.prompt_len) + int(c.regen.response_len)
    eval_end = int(c.bench.max_prompt_tokens) + int(c.eval.max_new_tokens)
    problems = []
    if int(c.regen.response_len) < int(c.eval.max_new_tokens):
        problems.append(f"regen.response_len={c.regen.response_len} < eval.max_new_tokens={c.eval.max_new_tokens}")
    if int(c.bench.max_prompt_tokens) > 0 and train_end < eval_end:
        problems.append(f"training sequences end at position {train_end} (regen.prompt_len + regen.response_len) but "
                        f"evaluation drafts up to {eval_end} (bench.max_prompt_tokens + eval.max_new_tokens)")
    if not problems:
        return None
    return "the drafter is trained on other positions than it is evaluated at: " + "; ".join(problems)


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def config_hash(obj: Any, length: int = 12) -> str:
    """Stable content hash of a config (or any JSON-able part of one)."""
    if isinstance(obj, DictConfig):
        obj = to_container(obj)
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


# ---------------------------------------------------------------------------------------------
# The one loader: every entry point builds its run config with `load_config`.

# a named layer: (where it came from, e.g. a file path or "command line"; its values, nested)
Layer = tuple[str, Any]


def _ready_range(n: Any) -> list[int]:
    return list(range(int(n)))


def _register_resolvers() -> None:
    """`${ready_range:${drafter.num_layers}}` -> [0, 1, ..., n-1]: "every draft layer" (a sweep row's value).

    The resolver API that takes nested interpolations is `register_new_resolver` up to omegaconf 2.3 and
    `register_resolver` from 2.4 on (where `register_new_resolver` is deprecated, and 2.3's
    `register_resolver` is the legacy API that refuses `${drafter.num_layers}` as an argument)."""
    if OmegaConf.has_resolver("ready_range"):
        return
    if "annotation_validation" in inspect.signature(OmegaConf.register_resolver).parameters:  # omegaconf >= 2.4
        OmegaConf.register_resolver("ready_range", _ready_range)
    else:  # omegaconf 2.3
        OmegaConf.register_new_resolver("ready_range", _ready_range)


_register_resolvers()


def clean_message(msg: str) -> str:
    """OmegaConf's messages carry several lines of internals; keep the one a user needs."""
    first = (msg.strip().splitlines() or [""])[0]
    if "is not a ListConfig" in first:
        first = re.sub(r"Invalid value assigned: .*", "expected a list (e.g. [30, 62]), got a scalar", first)
    kinds = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}
    found = re.fullmatch(r"Value '(.*)' of type '[\w.]+' could not be converted to (Integer|Float|Boolean)", first)
    if found:  # `threads.shared=abc`
        first = f"{found.group(1)!r}; expected {kinds[found.group(2)]}"
    return first


def yaml_problem(e: Exception) -> str:
    """A YAML parse error as one line with its position ("did not find expected ',' (line 2, column 36)")."""
    mark = getattr(e, "problem_mark", None)
    if getattr(e, "problem", None) and mark is not None:
        return f"{e.problem} (line {mark.line + 1}, column {mark.column + 1})"  # type: ignore[attr-defined]
    return clean_message(str(e) or type(e).__name__)


def read_yaml(path: Path, what: str) -> DictConfig:
    """A YAML file of config keys (`what`: preset, profile, sweep, config file); a missing file, bad YAML or
    a file that is not a mapping is one ConfigError naming the file and what was expected."""
    path = Path(path)
    if not path.is_file():
        if what in ("preset", "profile", "sweep"):  # a name looked up in a folder: say which names exist
            choices = sorted(p.stem for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
            raise ConfigError(f"{what} '{path.stem}' not found at {path}; expected one of {choices}")
        raise ConfigError(f"{what} {path} does not exist; expected a YAML file of config keys (e.g. reader: {{rank: 8}})")
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return loaded


def preset_names(experiments_dir: Path | str = EXPERIMENTS_DIR) -> list[str]:
    """The presets `load_config(preset=...)` knows: experiments/presets/*.yaml."""
    return sorted(p.stem for p in (Path(experiments_dir) / "presets").glob("*.yaml"))


def nest(dotted: Mapping[str, Any]) -> dict:
    """{"reader.rank": 8} -> {"reader": {"rank": 8}}."""
    out: dict = {}
    for key, value in dotted.items():
        *parents, last = str(key).split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
    return out


def parse_override(token: str) -> tuple[str, Any]:
    """`a.b=v` from a command line -> ("a.b", v), v parsed as YAML (`reader.layers=[30,62]` is a list)."""
    if "=" not in token:
        raise ConfigError(f"override '{token}': expected KEY=VALUE (e.g. reader.rank=16)")
    key, _, text = token.partition("=")
    try:
        node: Any = OmegaConf.to_container(OmegaConf.from_dotlist([token]))
    except Exception as e:
        why = getattr(e, "problem", None) or clean_message(str(e))
        raise ConfigError(f"override '{token}': the value {text!r} is not valid YAML ({why}); expected "
                          "KEY=VALUE with a YAML value, e.g. reader.rank=16 or reader.layers=[30,62]") from None
    for part in key.split("."):
        node = node[part]
    return key, node


def layer_keys(tree: Any, prefix: str = "") -> set[str]:
    """The dotted keys a layer sets: {"reader": {"rank": 8}} -> {"reader.rank"}."""
    if isinstance(tree, (DictConfig, ListConfig)):
        tree = OmegaConf.to_container(tree, resolve=False)
    if not isinstance(tree, dict) or not tree:
        return {prefix[:-1]} if prefix else set()
    return {k for key, value in tree.items() for k in layer_keys(value, f"{prefix}{key}.")}


def blame(key: str, layers: Sequence[tuple[str, set[str]]], default: str) -> str:
    """Where a bad value at `key` came from: the last layer that sets it (or a key inside it, or the
    section holding it), so a command-line value is blamed on the command line, not on the spec file;
    `default` when no layer sets it (a schema default, or a check across several keys)."""
    for source, keys in reversed(layers):
        if any(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in keys):
            return source
    return default


def _check(cfg: DictConfig, layers: Sequence[tuple[str, set[str]]], default: str) -> None:
    """Resolve and range-check `cfg`; the error names the layer that set the bad key (`blame`)."""
    try:
        OmegaConf.to_container(cfg, resolve=True)  # interpolations resolve (and type-check) here
        validate(cfg)
    except ConfigError as e:
        found = re.search(r"at key '([^']*)'", str(e))
        where = blame(found.group(1), layers, default) if found else default
        raise ConfigError(f"{where}: {clean_message(str(e))}") from None
    except Exception as e:  # an interpolation that fails to resolve
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"{blame(key, layers, default)}: bad value at key '{key}': {clean_message(str(e))}") from None


@functools.lru_cache(maxsize=4)
def _defaults(base: str, stamp: tuple[int, int]) -> tuple[DictConfig, frozenset[str]]:
    """schema <- base.yaml and the keys base.yaml sets (cached per file version: it is every row's first,
    and largest, merge)."""
    raw = read_yaml(Path(base), "base config")
    return merge(schema(), raw, source=base), frozenset(layer_keys(raw))


def load_config(preset: Optional[str] = None, profile: Optional[str] = None,
                files: Sequence[Union[str, Path, Layer]] = (), overrides: Sequence[str] = (),
                layers: Sequence[Layer] = (), experiments_dir: Path | str = EXPERIMENTS_DIR) -> DictConfig:
    """The run config every entry point uses, validated: the schema <- experiments/base.yaml <-
    presets/<preset>.yaml <- each of `files` (a YAML path, or a (source, mapping) layer such as a sweep
    spec's `config:`) <- profiles/<profile>.yaml's `config:` section <- `a.b=v` overrides <- `layers`
    ((source, nested mapping), e.g. a sweep row). One place for the merge order, so a preset, a profile
    or an override means the same in every command. A bad input is one ConfigError that names the file
    (or "command line") and the key, and says what was expected. base.yaml restates the schema
    (`python -m sweeps.basegen --check`); without it the schema alone gives the defaults. A profile's
    sweep-level keys (seeds, search) are the sweep's business (sweeps.spec), not read here."""
    root = Path(experiments_dir)
    named: list[Layer] = []
    if preset:
        path = root / "presets" / f"{preset}.yaml"
        named.append((str(path), read_yaml(path, "preset")))
    for f in files:
        if isinstance(f, tuple):
            named.append((str(f[0]), f[1]))
        else:
            named.append((str(f), read_yaml(Path(f), "config file")))
    if profile:
        path = root / "profiles" / f"{profile}.yaml"
        section = read_yaml(path, "profile").get("config")
        if section is not None and not isinstance(section, DictConfig):
            raise ConfigError(f"{path}: bad value at key 'config': {section!r}; expected a mapping of config keys "
                              "(e.g. config: {reader: {rank: 8}})")
        named.append((str(path), nest(OmegaConf.to_container(section) if section is not None else {})))
    named.append(("command line", nest(dict(parse_override(str(t)) for t in overrides))))
    named.extend((str(source), layer) for source, layer in layers)

    base = root / "base.yaml"
    provenance: list[tuple[str, set[str]]] = []
    if base.is_file():
        st = base.stat()
        defaults, base_keys = _defaults(str(base), (st.st_mtime_ns, st.st_size))
        cfg = copy.deepcopy(defaults)
        provenance.append((str(base), set(base_keys)))
    else:
        cfg = schema()
    for source, layer in named:
        layer = renamed_keys(_without_retired(layer, source), source)
        cfg = merge(cfg, layer, source=source)
        provenance.append((source, layer_keys(layer)))
    default = next((source for source, keys in reversed(provenance) if keys), "config")
    _check(cfg, provenance, default)
    return cfg


# ---------------------------------------------------------------------------------------------
# Commands whose typed config is their command line: `a.b=v` overrides (`load_config(overrides=...)`, the
# one parser, as `python -m sweeps.run` takes them) instead of flags that restated config keys.

def replaced_flags(argv: Sequence[str], replaced: Mapping[str, str]) -> None:
    """Refuse a flag that restated a config key and gave way to the key's `a.b=v` override: `replaced` maps each
    old flag to its override, a key whose value follows the flag (`{"-k": "drafter.proposals"}`) or a whole
    override for a switch (`{"--exact": "eval.exact=on"}`). One ConfigError naming the override that says it,
    e.g. `-k 6: this flag is gone; the config says it: drafter.proposals=6`. Tokens after `--` are not read."""
    for i, token in enumerate(argv):
        if token == "--":
            return
        flag, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if flag not in replaced and not token.startswith("--") and token[:2] in replaced:  # -k6
            flag, eq, value = token[:2], "=", token[2:]
        if flag not in replaced:
            continue
        override, shown = replaced[flag], token
        if "=" not in override:
            if not eq and i + 1 < len(argv):
                value, shown = argv[i + 1], f"{token} {argv[i + 1]}"
            override = f"{override}={value if (eq or i + 1 < len(argv)) else 'VALUE'}"
        raise ConfigError(f"{shown}: this flag is gone; the config says it: {override} (a key=value override, "
                          "as python -m sweeps.run takes them)")
