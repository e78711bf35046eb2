"""Proposition 1 on a trained drafter: how far the reader's queries leave the span of the target's own.

    python -m benchmarks.diagnostics.query_span --source RUN_ID --tracking-uri sqlite:///mlflow.db [--log-mlflow]
    python -m benchmarks.diagnostics.query_span --source DRAFTER_FOLDER [key=value ...] [--out prop1.json]
    python -m benchmarks.diagnostics.query_span --rows RUN_ID RUN_ID ... --tracking-uri ...  # one table

Proposition 1 (`benchmarks.diagnostics.theory`): from a state S (d_v x d_k) whose readouts O = S Q of the
queries Q are exposed, a new query q* is answered by O alone only inside span(Q);
S (I - Π_Q) q* needs S itself. The target itself has read each GDN state with its own queries, so
what the reader can add beyond the target's own readouts lies where its queries leave the span of
the queries the target used on the prefix. For every source layer and value head of a ReaDy
drafter, at read positions of the held-out sequences the sweeps' teacher-forced metric uses
(`eval.heldout_tf_samples` regenerated sequences of the validation split; the first `--prompts`
of them; `--positions` full-block anchors per sequence, evenly spaced), this measures:

- `outside_share` = |(I - Π_Q) q*|² / |q*|² for each query q* the reader issues (every row of the
  block, every reader), with Q the target's L2-normalised GDN queries of that layer and head at the
  committed prefix positions 0..a-1 (anchor a; the reader reads the state after token a-1);
- `novel_share` = |S (I - Π_Q) q*|² / |S q*|² with S that committed state: the part of the readout
  only S knows (a ratio, not a partition: S Π q* and S (I - Π) q* need not be orthogonal, so a
  query whose readout nearly cancels can exceed 1 and dominate the mean: read its p50 and
  `novel_share_pooled`, the ratio of sums over every query);
  `novel_share_read` the same after the reader's value compression V^T (what the reader receives);
- `random_*`: the same for a random Gaussian query of the same norm, the reference: in d_k
  dimensions its outside share is about 1 - rank(Q)/d_k (`random_expected_outside`);
- `prefix_rank`: the numerical rank of Q. Π_Q comes from an SVD (`theory.projector`): singular
  values <= `--rtol` (default 1e-3) times the largest count as zero. The queries are computed in the
  target's dtype (bf16 for the 27B target: ~3 significant digits), so directions weaker than ~1e-3 of
  the strongest are not resolved; with a prefix longer than d_k the rank, and so every share,
  depends on this tolerance: report it with the numbers (it is in the JSON).

Each is summarised per (layer, head), per layer and overall as mean, p10, p50, p90 over read
positions x queries. Output: JSON on stdout (or `--out`); `--log-mlflow` logs the summaries as
metrics `prop1/...` on the row's run (and the JSON as artifact `prop1/query_span.json`). `--rows`
measures several runs (e.g. the rank sweep's ReaDy rows, r = 8..64) and prints one Markdown table of
the outside and novel shares beside each row's `overall/state_reliance` (tau with its own states -
tau with another prompt's, `sweeps.tracking`) and `heldout_tf/tau`; `--reuse-logged` takes the
`prop1/` metrics a run already has instead of measuring it again.

A run id resolves, like `ready.drafter.export`, to the drafter folder its evaluation.json names,
and its resolved config.yaml gives the target and the held-out sequences (run it where the sweep
ran, or point `artifacts_dir=` at the sweep's artifacts); `key=value` overrides apply on top. A
drafter folder takes its config from the overrides alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from benchmarks.diagnostics.heldout_setup import heldout_config
from benchmarks.diagnostics.theory import projector
from ready.config import entry_point
from ready.drafter import DrafterError, load_drafter
from ready.drafter.export import resolve_source
from ready.loading import load_configured_target
from ready.train.regen import build_validation_data
from ready.train.regen_data import RegenData
from ready.train.teacher_forced import full_block_anchors
from ready.train.teacher_pass import reads_shuffled_states
from reports import mlflow_store

RTOL = 1e-3  # singular values <= RTOL * sigma_max of the prefix queries count as zero (see the module doc)
PREFIX = "prop1"  # MLflow metric prefix
STATS = ("mean", "p10", "p50", "p90")
METRICS = ("outside_share", "novel_share", "novel_share_read", "random_outside_share", "random_novel_share",
           "prefix_rank")
RELIANCE = "overall/state_reliance"  # sweeps.tracking (reports.stats.run_metrics): tau own states - tau swapped
HELDOUT_TAU = "heldout_tf/tau"
QUANTILE_MAX = 1 << 24
# query_shares' keys -> the names pooled per (layer, head); each also for the random reference but novel_read
POOLED = {"outside": "outside_share", "novel": "novel_share", "novel_read": "novel_share_read",
          "novel_num": "novel_num", "novel_den": "novel_den"}


class QuerySpanError(ValueError):
    """A drafter or input this diagnostic cannot measure; the message says what was expected."""


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """|num|² / |den|² over dim -2 (columns are vectors); NaN where |den| = 0."""
    n, d = num.pow(2).sum(-2), den.pow(2).sum(-2)
    return torch.where(d > 0, n / d.clamp_min(torch.finfo(d.dtype).tiny), torch.full_like(d, float("nan")))


def query_shares(S: torch.Tensor, P: torch.Tensor, q: torch.Tensor,
                 Vt: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """Per query (a column of q [..., d_k, n]) with Π_Q = P [..., d_k, d_k] and the state S [..., d_v, d_k]
    (paper layout: the readout is S q): `outside` = |(I - Π) q|²/|q|², `novel` = |S (I - Π) q|²/|S q|²
    (the second term of `theory.decompose`), and with Vt [..., r, d_v] `novel_read` = the same after V^T.
    Each [..., n]; NaN where the denominator is zero. Also the squared norms for pooled ratios."""
    out_q = q - P @ q
    Sq, Sout = S @ q, S @ out_q
    res = {"outside": _ratio(out_q, q), "novel": _ratio(Sout, Sq),
           "novel_num": Sout.pow(2).sum(-2), "novel_den": Sq.pow(2).sum(-2)}
    if Vt is not None:
        res["novel_read"] = _ratio(Vt @ Sout, Vt @ Sq)
    return res


def prefix_projectors(q_tok: torch.Tensor, ends: Sequence[int], rtol: float = RTOL) -> tuple[torch.Tensor, torch.Tensor]:
    """Π of the queries q_tok [H, T, d_k] at positions 0..e-1, for each e of `ends`: ([E, H, d_k, d_k]
    projectors, [E, H] numerical ranks = trace Π); float64, singular values <= rtol * σ_max dropped."""
    Ps = [projector(q_tok[:, :e].transpose(-1, -2).double(), rtol) for e in ends]
    P = torch.stack(Ps)
    return P, P.diagonal(dim1=-2, dim2=-1).sum(-1).round()


@dataclass
class _Pool:
    """Values of one (layer, head): lists of 1-d tensors, concatenated at the end."""

    values: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def add(self, name: str, t: torch.Tensor) -> None:
        self.values.setdefault(name, []).append(t.detach().double().flatten().cpu())

    def cat(self, name: str) -> torch.Tensor:
        return torch.cat(self.values.get(name) or [torch.zeros(0, dtype=torch.float64)])


def summarise(t: torch.Tensor) -> dict[str, Optional[float]]:
    """mean, p10, p50, p90 and n of the finite values of t (None when there are none)."""
    t = t[torch.isfinite(t)]
    if t.numel() == 0:
        return {**{s: None for s in STATS}, "n": 0}
    mean = float(t.mean())
    if t.numel() > QUANTILE_MAX:  # torch.quantile's input limit: quantiles of a fixed random subsample
        t = t[torch.randperm(t.numel(), generator=torch.Generator().manual_seed(0))[:QUANTILE_MAX]]
    qs = torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=t.dtype))
    return {"mean": mean, "p10": float(qs[0]), "p50": float(qs[1]), "p90": float(qs[2]), "n": int(t.numel())}


def _summary(pools: Sequence[_Pool], d_k: int) -> dict[str, Any]:
    """Every metric's summary over the pooled values of `pools`, the pooled novel ratios and the
    random reference's expected outside share."""
    cat = lambda name: torch.cat([p.cat(name) for p in pools])  # noqa: E731
    out: dict[str, Any] = {m: summarise(cat(m)) for m in METRICS}
    for stem in ("", "random_"):
        num, den = cat(stem + "novel_num"), cat(stem + "novel_den")
        out[stem + "novel_share_pooled"] = float(num.sum() / den.sum()) if den.numel() and den.sum() > 0 else None
    rank = out["prefix_rank"]["mean"]
    out["random_expected_outside"] = None if rank is None else 1.0 - rank / d_k
    return out


def _sequence_anchors(data: RegenData, proposals: int, prompts: Optional[int], positions: int) -> list[tuple[int, list[int]]]:
    """(row, evenly spaced full-block anchors) of the first `prompts` held-out sequences that have one."""
    anchors, valid = full_block_anchors(data, proposals)
    n = len(data) if prompts is None else min(int(prompts), len(data))
    out = []
    for i in range(n):
        cand = anchors[i][valid[i]]
        if cand.numel() == 0:
            continue
        idx = torch.linspace(0, cand.numel() - 1, min(positions, cand.numel())).round().long().unique()
        out.append((i, cand[idx].tolist()))
    return out


def check_drafter(drafter: Any) -> None:
    """QuerySpanError unless `drafter` reads its own sequence's committed states (a ReaDy drafter)."""
    if not getattr(drafter, "reader_enabled", False):
        raise QuerySpanError("this drafter has no reader (a DSpark, DFlash or FT row); expected a ReaDy drafter")
    if reads_shuffled_states(drafter):
        raise QuerySpanError("this drafter is the state placebo (reader.states=shuffled): it reads another "
                             "sequence's states, so the span of its own sequence's queries does not bound them; "
                             "expected a ReaDy row")


@torch.no_grad()
def measure(drafter: Any, target: Any, data: RegenData, prompts: Optional[int] = None, positions: int = 8,
            rtol: float = RTOL, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """The module doc's shares for `drafter` reading `target`'s states on the held-out `data`, as a
    JSON-able dict: `overall`, `layers` {model layer id: summary + `heads` {head: summary}} and the set-up."""
    check_drafter(drafter)
    if positions < 1 or not rtol > 0:
        raise QuerySpanError(f"positions = {positions}, rtol = {rtol}; expected positions >= 1 and rtol > 0")
    device = next(drafter.parameters()).device
    layers = [int(i) for i in drafter.state_layers]
    readers = {int(k): r for k, r in drafter.readers.items()}
    any_reader = next(iter(readers.values()))
    d_k, H = any_reader.d_k, any_reader.num_pairs // len(layers)
    gdn = {lid: target.model.layers[lid].linear_attn for lid in layers}
    rep = {lid: m.nv // m.nk for lid, m in gdn.items()}
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, lid=lid: seen.__setitem__(f"gdn{lid}", args[0]))
             for lid, m in gdn.items()]
    hooks += [r.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(f"reader{i}", args[0]))
              for i, r in readers.items()]
    g = torch.Generator().manual_seed(seed)
    pools = {(lid, h): _Pool() for lid in layers for h in range(H)}
    plan = _sequence_anchors(data, int(drafter.proposals), prompts, positions)
    if not plan:
        raise QuerySpanError("no held-out sequence has a full-block anchor; expected regenerated sequences longer "
                             f"than the block ({drafter.proposals + 1} tokens: the anchor + {drafter.proposals} proposals)")
    was_training = drafter.training
    drafter.eval()
    try:
        for row, ends in tqdm(plan, desc="query span", unit="seq", disable=not progress, leave=False):
            T = int(data.lengths[row])
            tokens = data.tokens[row:row + 1, :T].to(device)
            a = torch.tensor([ends], device=device)
            seen.clear()
            out = target(tokens, capture_layers=list(drafter.capture_layers), state_layers=layers,
                         state_positions=a - 1, logits_from=None)
            drafter.forward_train(tokens, out.hidden, a, out.states)
            q_reader = {i: (r.queries(seen[f"reader{i}"]).double(), r.V.detach().double()) for i, r in readers.items()}
            for li, lid in enumerate(layers):
                q_tok = gdn[lid].queries(seen[f"gdn{lid}"])[0]  # [H_v, T, d_k]
                Pk, rank_k = prefix_projectors(q_tok[:: rep[lid]], ends, rtol)  # one per key head
                P, rank = Pk.repeat_interleave(rep[lid], 1), rank_k.repeat_interleave(rep[lid], 1)  # [A, H, ...]
                S = out.states[0, :, li].double().transpose(-1, -2)  # [A, H, d_v, d_k]: the readout is S q
                pairs = slice(li * H, (li + 1) * H)
                for q_all, V in q_reader.values():
                    q = q_all[:, :, pairs].permute(0, 2, 3, 1)  # [A, H, d_k, R]: the block's queries as columns
                    Vt = V[pairs].transpose(-1, -2)  # [H, r, d_v]
                    rand = torch.randn(q.shape, generator=g, dtype=torch.float64).to(device)
                    rand = rand * (q.norm(dim=-2, keepdim=True) / rand.norm(dim=-2, keepdim=True))
                    got = {k: v.cpu() for k, v in query_shares(S, P, q, Vt).items()}  # one copy, then per head
                    ref = {k: v.cpu() for k, v in query_shares(S, P, rand, Vt).items()}
                    rank_h = rank.cpu()
                    for h in range(H):
                        pool = pools[(lid, h)]
                        for key, name in POOLED.items():
                            pool.add(name, got[key][:, h])
                            if key != "novel_read":
                                pool.add("random_" + name, ref[key][:, h])
                        pool.add("prefix_rank", rank_h[:, h])
    finally:
        for hk in hooks:
            hk.remove()
        drafter.train(was_training)
    return {
        "diagnostic": "query_span", "rtol": rtol, "seed": seed, "d_k": d_k, "heads": H,
        "reader_rank": any_reader.rank, "state_layers": layers, "inject_layers": sorted(readers),
        "sequences": len(plan), "read_positions": sum(len(e) for _, e in plan),
        "positions_per_sequence": positions, "queries_per_read": (drafter.proposals + 1) * len(readers),
        "overall": _summary(list(pools.values()), d_k),
        "layers": {str(lid): {**_summary([pools[(lid, h)] for h in range(H)], d_k),
                              "heads": {str(h): _summary([pools[(lid, h)]], d_k) for h in range(H)}}
                   for lid in layers},
    }


def flat_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The MLflow metrics of a result: `prop1/<metric>[_p10|_p50|_p90]` overall (the mean unsuffixed),
    `prop1/layer<L>/<metric>` (means) per source layer, pooled novel ratios and the random reference."""
    out: dict[str, float] = {}

    def put(stem: str, summary: dict[str, Any], quantiles: bool) -> None:
        for m in METRICS:
            for s in (STATS if quantiles else ("mean",)):
                v = summary[m][s]
                if v is not None:
                    out[f"{stem}{m}" + ("" if s == "mean" else f"_{s}")] = v
        for k in ("novel_share_pooled", "random_novel_share_pooled", "random_expected_outside"):
            if summary.get(k) is not None:
                out[f"{stem}{k}"] = summary[k]

    put(f"{PREFIX}/", result["overall"], True)
    for lid, summary in result["layers"].items():
        put(f"{PREFIX}/layer{lid}/", summary, False)
    out[f"{PREFIX}/rtol"] = float(result["rtol"])
    out[f"{PREFIX}/d_k"] = float(result["d_k"])
    return out


# --- the command line: sources, MLflow ------------------------------------------------------------

def _run_config(client: Any, run_id: str) -> DictConfig:
    """A sweep row's resolved config (its config.yaml artifact)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            text = Path(client.download_artifacts(run_id, "config.yaml", tmp)).read_text()
        except Exception as e:  # no such run, no such artifact, unreadable store
            raise QuerySpanError(f"run {run_id!r}: no config.yaml ({type(e).__name__}); expected the run id of a "
                                 "sweep row") from None
    return OmegaConf.create(text)  # type: ignore[return-value]


@dataclass
class _Loader:
    """Loaded targets by their configuration, so rows of one sweep setting load theirs once."""

    threads: int
    progress: bool = True
    cache: dict[str, Any] = field(default_factory=dict)

    def __call__(self, cfg: DictConfig) -> tuple[Any, RegenData]:
        key = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, ["target", "pretrain", "corpus", "artifacts_dir"]))
        if key not in self.cache:
            self.cache = {key: load_configured_target(cfg, progress=self.progress)}  # one target in memory at a time
        loaded = self.cache[key]
        val = build_validation_data(cfg, loaded.target, loaded.tokenizer, progress=self.progress)
        if val is None or len(val) == 0:
            raise QuerySpanError("eval.heldout_tf_samples = 0: no held-out sequences to measure on; expected >= 1")
        return loaded, val


def moved_artifact(path: Path, run_artifacts: str, artifacts: str) -> Path:
    """`path` (recorded by a run whose artifacts_dir was `run_artifacts`) under `artifacts` instead, when
    it does not exist as recorded: a sweep records paths relative to the directory it ran in, so
    `artifacts_dir=` on the command line finds them from anywhere."""
    if path.exists() or not run_artifacts or not artifacts:
        return path
    try:
        return Path(artifacts) / path.relative_to(run_artifacts)
    except ValueError:  # not under the run's artifacts_dir: leave it as recorded
        return path


def measure_source(source: str, overrides: Sequence[str], tracking_uri: Optional[str], load: _Loader,
                   prompts: Optional[int], positions: int, rtol: float, seed: int) -> dict[str, Any]:
    """`measure` for a drafter folder or a sweep row's run id (module doc), with where it came from."""
    run_id = None
    base = None
    if not Path(source).is_dir():
        run_id = source.removeprefix("runs:/").strip("/")
        base = _run_config(mlflow_store.client(tracking_uri), run_id)
    layer = None if base is None else (f"run {run_id}: config.yaml", base)
    cfg = heldout_config(overrides, 1, "the query spans are measured", base=layer)
    loaded, val = load(cfg)
    folder = resolve_source(source, tracking_uri or mlflow_store.DEFAULT_TRACKING_URI)
    if base is not None:
        folder = moved_artifact(folder, str(base.get("artifacts_dir", "")), str(cfg.artifacts_dir))
    drafter = load_drafter(folder, loaded.target)
    result = measure(drafter, loaded.target, val, prompts, positions, rtol, seed, progress=load.progress)
    return {"source": source, "run_id": run_id, "drafter_dir": str(folder), **result}


def log_to_run(result: dict[str, Any], tracking_uri: str) -> None:
    """Log `flat_metrics(result)` and the JSON as artifact prop1/query_span.json on result['run_id']."""
    from mlflow.entities import Metric

    c = mlflow_store.client(tracking_uri)
    run_id = result["run_id"]
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in flat_metrics(result).items()]
    for i in range(0, len(metrics), 500):
        mlflow_store.retry(lambda b=metrics[i:i + 500]: c.log_batch(run_id, metrics=b))
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp, "query_span.json")
        f.write_text(json.dumps(result, indent=1))
        mlflow_store.retry(lambda: c.log_artifact(run_id, str(f), PREFIX))


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def rows_table(entries: Sequence[dict[str, Any]]) -> str:
    """One Markdown table: per run, the reader's rank and layers, the outside share (mean [p10, p90]) and
    the novel share (median and pooled ratio, robust to the near-zero readouts that can dominate its
    mean) beside the random reference, and the run's state reliance and teacher-forced tau."""
    head = ("| run | rank | layers | outside share | random outside | prefix rank / d_k | novel share p50 (pooled) "
            "| random novel p50 (pooled) | state reliance [lo, hi] | heldout tau |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in entries:
        m, p = e["metrics"], f"{PREFIX}/"
        d_k = m.get(p + "d_k")
        rank = m.get(p + "prefix_rank")
        rel = m.get(RELIANCE)
        rel_iv = "" if m.get(RELIANCE + "_lo") is None else f" [{_fmt(m[RELIANCE + '_lo'])}, {_fmt(m[RELIANCE + '_hi'])}]"
        lines.append(" | ".join([
            f"| {e['name']}", str(e.get("rank", "-")), str(e.get("layers", "-")),
            f"{_fmt(m.get(p + 'outside_share'))} [{_fmt(m.get(p + 'outside_share_p10'))}, "
            f"{_fmt(m.get(p + 'outside_share_p90'))}]",
            _fmt(m.get(p + "random_outside_share")),
            "-" if rank is None or not d_k else f"{rank:.1f} / {d_k:g}",
            f"{_fmt(m.get(p + 'novel_share_p50'))} ({_fmt(m.get(p + 'novel_share_pooled'))})",
            f"{_fmt(m.get(p + 'random_novel_share_p50'))} ({_fmt(m.get(p + 'random_novel_share_pooled'))})",
            f"{_fmt(rel)}{rel_iv}", _fmt(m.get(HELDOUT_TAU)) + " |"]))
    return "\n".join(lines)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.query_span", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--source", help="a ReaDy drafter folder, or a sweep row's MLflow run id (runs:/ID or ID)")
    which.add_argument("--rows", nargs="+", metavar="RUN_ID", help="several rows' run ids: one table against "
                                                                     "their state reliance")
    ap.add_argument("--tracking-uri", default=None, help="MLflow store of the runs (default: $MLFLOW_TRACKING_URI, "
                                                         "else sqlite:///mlflow.db)")
    ap.add_argument("--prompts", type=int, default=None, help="the first N held-out sequences (default: all "
                                                               "eval.heldout_tf_samples)")
    ap.add_argument("--positions", type=int, default=8, help="read positions (full-block anchors) per sequence, "
                                                             "evenly spaced (default %(default)s)")
    ap.add_argument("--rtol", type=float, default=RTOL, help="relative singular-value tolerance of span(Q) "
                                                            "(default %(default)g)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random reference queries")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", default=None, help="write the JSON here instead of stdout (--rows: the rows' JSON)")
    ap.add_argument("--log-mlflow", action="store_true", help="log prop1/ metrics and the JSON on each run")
    ap.add_argument("--reuse-logged", action="store_true", help="--rows: take a run's logged prop1/ metrics "
                                                                "instead of measuring it again")
    ap.add_argument("overrides", nargs="*", help="config overrides a.b=value (on top of a run's config)")
    a = ap.parse_args(argv)
    if a.threads < 1:
        ap.error(f"--threads {a.threads}: expected an integer >= 1")
    if a.prompts is not None and a.prompts < 1:
        ap.error(f"--prompts {a.prompts}: expected an integer >= 1")
    if a.rows is not None:  # `--rows ID ID a.b=v`: nargs="+" takes the overrides too; they are not run ids
        a.overrides += [r for r in a.rows if "=" in r]
        a.rows = [r for r in a.rows if "=" not in r] or ap.error("--rows: expected at least one run id")
    torch.set_num_threads(a.threads)
    run_source = a.rows is not None or not Path(a.source).is_dir()
    uri = mlflow_store.resolve_tracking_uri(a.tracking_uri) if run_source else a.tracking_uri
    if a.log_mlflow and not run_source:
        ap.error("--log-mlflow needs a run id (--source RUN_ID or --rows), not a drafter folder")
    load = _Loader(a.threads)
    try:
        if a.source is not None:
            result = measure_source(a.source, a.overrides, uri, load, a.prompts, a.positions, a.rtol, a.seed)
            if a.log_mlflow:
                log_to_run(result, uri)
            text = json.dumps(result, indent=1)
            if a.out:
                Path(a.out).write_text(text + "\n")
            else:
                print(text)
            return 0
        client = mlflow_store.client(uri)
        entries = []
        for rid in a.rows:
            rid = rid.removeprefix("runs:/").strip("/")
            try:
                run = client.get_run(rid)
            except Exception as e:
                raise QuerySpanError(f"run {rid!r} in {uri}: {type(e).__name__}; expected a sweep row's run id") from None
            cfg = _run_config(client, rid)
            logged = {k: v for k, v in run.data.metrics.items() if k.startswith(PREFIX + "/")}
            result = None
            if not (a.reuse_logged and f"{PREFIX}/outside_share" in logged):
                result = measure_source(rid, a.overrides, uri, load, a.prompts, a.positions, a.rtol, a.seed)
                if a.log_mlflow:
                    log_to_run(result, uri)
                logged = flat_metrics(result)
            reader = cfg.get("reader") or {}
            entries.append({"run_id": rid, "name": run.info.run_name or rid[:8], "rank": reader.get("rank"),
                            "layers": list(reader.get("layers") or []),
                            "metrics": {**logged, **{k: v for k, v in run.data.metrics.items()
                                                     if k.startswith((RELIANCE, HELDOUT_TAU))}},
                            "result": result})
        print(rows_table(entries))
        if a.out:
            Path(a.out).write_text(json.dumps(entries, indent=1) + "\n")
        return 0
    except (QuerySpanError, DrafterError, mlflow_store.TrackingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
