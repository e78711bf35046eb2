"""Read a sweep's child runs from MLflow into polars and aggregate them over seeds.

The naming contract is docs/interfaces.md, section "MLflow": experiment `ready-<sweep>`, child
runs tagged `ready.kind=variant`, `ready.*` tags, flattened config params, metrics
`<benchmark>/<name>`. MLflow hands tags and params back as strings; they are cast here, once.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

import polars as pl

from reports.errors import ReportError
from reports.mlflow_store import TrackingError, check_uri, database_url, newer_store

EXPERIMENT_PREFIX = "ready-"
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
FINISHED = "FINISHED"
PARAM_PREFIX = "param."

# tags every child run carries (missing ones become null columns, so code can rely on them)
TAGS = (
    "ready.sweep",
    "ready.table",
    "ready.method",
    "ready.label",
    "ready.order",
    "ready.variant_id",
    "ready.config_hash",
    "ready.model",
    "ready.seed",
    "ready.setting",  # hash of the sweep's common config (written by sweeps/, one baseline set each)
    "ready.profile",  # the profile the sweep ran with ("" = none), from the sweep's (parent) run
    "ready.lossless",  # "1"/"0": speculative output equal to AR greedy on every prompt
)
INT_TAGS = ("ready.order", "ready.seed")

METHOD_NAMES = {"ar": "AR", "dspark": "DSpark", "dflash": "DFlash", "ft": "DSpark + FT",
                "placebo": "Placebo (shuffled states)", "ready": "ReaDy"}
NOT_LOSSLESS = "NOT_LOSSLESS"  # status given to a finished run whose output differed from AR greedy
EVALUATION = "evaluation.json"
EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"


def default_tracking_uri() -> str:
    """`$MLFLOW_TRACKING_URI` when set, else the team default `sqlite:///mlflow.db`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _mlflow_tables() -> set[str]:
    """The tables MLflow's SQL store expects; it creates or migrates them when one is missing."""
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (registers every table on Base)
    from mlflow.store.db.base_sql_model import Base

    return set(Base.metadata.tables)


def check_sqlite_store(db: Path, tracking_uri: str) -> None:
    """Refuse, reading it only, a sqlite file that MLflow would write into when it opens it: a file
    without MLflow's tables (MLflow would write its whole schema into it), one of another MLflow
    version (it would migrate it) or one without the Default experiment (it would add one). A
    report reads a store; it never changes one."""
    import sqlite3
    from urllib.parse import quote

    expected = "expected the store a sweep wrote (an mlflow.db or a tracking server)"
    try:
        con = sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in con.execute("select name from sqlite_master where type = 'table'")}
            default = "experiments" in tables and con.execute(
                "select 1 from experiments where experiment_id = 0").fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error as e:
        raise ReportError(f"tracking URI {tracking_uri!r}: not a readable MLflow store ({e}); {expected}") from None
    newer = newer_store(db)
    if newer is not None:
        raise ReportError(f"tracking URI {tracking_uri!r}: {newer}")
    missing = sorted(_mlflow_tables() - tables)
    if "experiments" in missing or "runs" in missing:
        raise ReportError(f"tracking URI {tracking_uri!r}: {db} is not an MLflow store (a SQLite file without MLflow's "
                          f"tables; left as it is); {expected}")
    if missing:
        raise ReportError(f"tracking URI {tracking_uri!r}: {db} is the store of another MLflow version (no table "
                          f"{missing[0]!r}; left as it is); expected a store this MLflow reads as it is "
                          f"(`mlflow db upgrade {tracking_uri}` first)")
    if not default:
        raise ReportError(f"tracking URI {tracking_uri!r}: {db} lacks MLflow's Default experiment (left as it is); "
                          f"{expected}")


_reachable: set[str] = set()  # tracking URIs this process has found reachable


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    tracking_uri = database_url(tracking_uri)  # postgresql:// as the docs write it: the installed driver
    if tracking_uri not in _reachable:
        try:  # a typo in the scheme, a server or database that does not answer: one line within seconds
            check_uri(tracking_uri)
        except TrackingError as e:
            raise ReportError(str(e)) from None
        _reachable.add(tracking_uri)
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        if not db.is_file():
            raise ReportError(
                f"tracking URI {tracking_uri!r}: no MLflow database at {db}; expected the store a "
                "sweep wrote (run `python -m sweeps.run NAME` first or pass --tracking-uri)"
            )
        check_sqlite_store(db, tracking_uri)  # before MLflow opens it: it writes into what is not its store
    try:  # a file that is not an MLflow store fails here, not deep in a table
        client = MlflowClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)
    except Exception as e:
        first = next((ln for ln in str(e).strip().splitlines() if ln.strip()), type(e).__name__)
        raise ReportError(f"tracking URI {tracking_uri!r}: not a readable MLflow store ({first[:200]}); "
                          "expected the store a sweep wrote (an mlflow.db or a tracking server)") from None
    return client


def list_sweeps(tracking_uri: str) -> list[str]:
    """Names of the sweeps (experiments `ready-<sweep>`) the store holds, sorted."""
    client = _client(tracking_uri)
    names, token = [], None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        names += [e.name[len(EXPERIMENT_PREFIX):] for e in page if e.name.startswith(EXPERIMENT_PREFIX)]
        token = page.token
        if not token:
            return sorted(names)


def load_runs(tracking_uri: str, sweep: str) -> pl.DataFrame:
    """Every child run (any status) of one sweep: one row per run, tags/params cast, metrics float.

    Columns: `run_id`, `status`, `start_time`, the `ready.*` tags (order and seed as Int64),
    `param.<key>` for every param (cast to int/float/bool where every value parses), and one
    Float64 column per metric name (latest value).
    """
    client = _client(tracking_uri)
    name = EXPERIMENT_PREFIX + sweep
    exp = client.get_experiment_by_name(name)
    if exp is None:
        found = ", ".join(list_sweeps(tracking_uri)) or "none"
        raise ReportError(f"sweep {sweep!r}: no MLflow experiment {name!r} at {tracking_uri}; sweeps found: {found}")
    profiles = {run.info.run_id: run.data.tags.get("ready.profile")
                for run in _search(client, exp.experiment_id, "tags.`ready.kind` = 'sweep'")}
    records = []
    for run in _search(client, exp.experiment_id, "tags.`ready.kind` = 'variant'"):
        rec: dict = {"run_id": run.info.run_id, "status": run.info.status, "start_time": run.info.start_time,
                     "ready.profile": profiles.get(run.data.tags.get("mlflow.parentRunId"))}
        rec.update({k: v for k, v in run.data.tags.items() if k.startswith("ready.")})
        rec.update({PARAM_PREFIX + k: v for k, v in run.data.params.items()})
        rec.update({k: float(v) for k, v in run.data.metrics.items()})
        records.append(rec)
    return runs_frame(records, sweep)


def _search(client, experiment_id: str, filter_string: str) -> list:
    """Every run of the experiment that matches, over all result pages."""
    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def runs_frame(records: Sequence[dict], sweep: str) -> pl.DataFrame:
    """Build the typed runs frame from raw MLflow records (strings for tags and params)."""
    columns: dict[str, None] = {}
    for rec in records:
        columns.update(dict.fromkeys(rec))
    schema: dict[str, pl.DataType] = {}
    for col in columns:
        if col == "start_time":
            schema[col] = pl.Int64()
        elif col in ("run_id", "status") or col.startswith(("ready.", PARAM_PREFIX)):
            schema[col] = pl.String()
        else:
            schema[col] = pl.Float64()
    for tag in TAGS:
        schema.setdefault(tag, pl.String())
    schema.setdefault("run_id", pl.String())
    schema.setdefault("status", pl.String())
    schema.setdefault("start_time", pl.Int64())
    df = pl.DataFrame([{c: rec.get(c) for c in schema} for rec in records], schema=schema)
    metric_cols = [c for c, t in schema.items() if t == pl.Float64()]
    df = df.with_columns(
        *(pl.col(t).cast(pl.Int64, strict=False) for t in INT_TAGS),
        *(pl.col(c).fill_nan(None) for c in metric_cols),  # a NaN is a missing value, not a number
        pl.col("ready.sweep").fill_null(sweep),
        # a run without a variant id still groups with itself, never with another variant
        pl.coalesce("ready.variant_id", "ready.config_hash", "run_id").alias("ready.variant_id"),
    )
    return cast_params(df)


def cast_params(df: pl.DataFrame) -> pl.DataFrame:
    """Cast each `param.*` column to Int64, Float64 or Boolean when every value parses as such."""
    out = []
    for col in (c for c in df.columns if c.startswith(PARAM_PREFIX)):
        s = df[col]
        nulls = s.null_count()
        done = False
        for dtype in (pl.Int64, pl.Float64):
            cast = s.cast(dtype, strict=False)
            if cast.null_count() == nulls:
                out.append(cast)
                done = True
                break
        if not done:
            values = set(s.drop_nulls().str.to_lowercase().to_list())
            if values and values <= {"true", "false"}:
                out.append((s.str.to_lowercase() == "true").alias(col))
    return df.with_columns(out) if out else df


def metric_columns(runs: pl.DataFrame) -> list[str]:
    """Metric columns of a runs frame (`<benchmark>/<name>`)."""
    return [c for c in runs.columns if "/" in c and not c.startswith(("ready.", PARAM_PREFIX))]


def benchmarks(runs: pl.DataFrame, metric: str) -> list[str]:
    """Benchmarks (not `overall`) that some run logged `<b>/<metric>` for, in `bench.suites` order."""
    found = {c.split("/", 1)[0] for c in metric_columns(runs) if c.split("/", 1)[1] == metric}
    found.discard("overall")
    order: list[str] = []
    if PARAM_PREFIX + "bench.suites" in runs.columns:
        import ast

        for raw in runs[PARAM_PREFIX + "bench.suites"].drop_nulls().unique(maintain_order=True).to_list():
            try:
                suites = ast.literal_eval(str(raw))
            except (ValueError, SyntaxError):
                continue
            if isinstance(suites, (list, tuple)):
                order += [str(s) for s in suites if str(s) in found and str(s) not in order]
    return order + sorted(found - set(order))


def with_mean_over(runs: pl.DataFrame, name: str, columns: Sequence[str]) -> pl.DataFrame:
    """Add column `name`: the mean of `columns` per run, null when any of them is missing."""
    if not columns or any(c not in runs.columns for c in columns):
        return runs.with_columns(pl.lit(None, dtype=pl.Float64).alias(name))
    complete = pl.all_horizontal(*(pl.col(c).is_not_null() for c in columns))
    mean = pl.sum_horizontal(*columns) / len(columns)
    return runs.with_columns(pl.when(complete).then(mean).otherwise(None).alias(name))


@dataclass(frozen=True)
class Stat:
    """A metric over the finished seeds of one variant."""

    mean: float
    std: float | None  # sample std (ddof=1); None with a single seed
    n: int


@dataclass(frozen=True)
class Variant:
    """One row of a sweep: a variant and its finished seeds, aggregated."""

    variant_id: str
    method: str
    label: str
    order: int | None
    model: str | None
    seeds: tuple[int, ...]  # seeds with a finished run
    missing_seeds: tuple[int, ...]  # seeds some run of the sweep has but this variant did not finish
    unfinished: tuple[str, ...]  # statuses of its runs that did not finish
    stats: dict[str, Stat]
    counts: dict[str, int]  # finished runs that logged each metric

    @property
    def name(self) -> str:
        """Row label: the `ready.label` tag, else the method's display name."""
        return self.label or METHOD_NAMES.get(self.method, self.method or self.variant_id)

    @property
    def n_finished(self) -> int:
        return len(self.seeds) if self.seeds else 0

    def stat(self, metric: str) -> tuple[Stat | None, str | None]:
        """The metric's mean ± std, or None and the reason it is missing (for the footnote)."""
        if self.n_finished == 0:
            status = "/".join(sorted(set(self.unfinished))) or "none"
            return None, f"{self.name}: no finished run (status {status})"
        n = self.counts.get(metric, 0)
        if n < self.n_finished:
            where = "any run" if n == 0 else f"{self.n_finished - n} of {self.n_finished} runs"
            return None, f"{self.name}: metric {metric} not logged in {where}"
        return self.stats[metric], None


CONCURRENCY_KEY = PARAM_PREFIX + "eval.concurrency"


def with_concurrency(runs: pl.DataFrame) -> pl.DataFrame:
    """Add Int64 column `concurrency`: param `eval.concurrency`, 1 where the run predates the key."""
    value = (pl.col(CONCURRENCY_KEY).cast(pl.Int64, strict=False) if CONCURRENCY_KEY in runs.columns
             else pl.lit(None, dtype=pl.Int64))
    return runs.with_columns(value.fill_null(1).alias("concurrency"))


def common_params(runs: pl.DataFrame, ignored: Iterable[str] = ()) -> dict[str, str]:
    """Params (`param.*` columns, but `ignored`) with a single value over the finished runs: the config a
    group of runs shares."""
    fin = runs.filter(pl.col("status") == FINISHED)
    skip = set(ignored)
    out = {}
    for col in (c for c in fin.columns if c.startswith(PARAM_PREFIX) and c not in skip):
        values = fin[col].drop_nulls().unique()
        if len(values) == 1:
            out[col] = str(values[0])
    return out


def finished(runs: pl.DataFrame) -> pl.DataFrame:
    """The latest FINISHED run of every (variant, seed): a re-run of the same seed counts once."""
    return (
        runs.filter(pl.col("status") == FINISHED)
        .sort("start_time", nulls_last=False)
        .unique(subset=["ready.variant_id", "ready.seed"], keep="last", maintain_order=True)
    )


def not_lossless(runs: pl.DataFrame) -> pl.Expr:
    """Finished runs whose speculative output differed from AR greedy: metric `overall/lossless` < 1
    or tag `ready.lossless` = 0."""
    metric = pl.col("overall/lossless") < 1 if "overall/lossless" in runs.columns else pl.lit(False)
    return (pl.col("status") == FINISHED) & (metric.fill_null(False) | (pl.col("ready.lossless") == "0").fill_null(False))


def set_aside_not_lossless(runs: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, tuple[int, ...]]]:
    """Give not-lossless runs the status NOT_LOSSLESS, so no mean, gain or interval counts them.

    Returns the runs and, per variant id, the seeds set aside (for the table's footnote).
    """
    bad = runs.filter(not_lossless(runs))
    aside: dict[str, tuple[int, ...]] = {}
    for r in bad.iter_rows(named=True):
        aside[r["ready.variant_id"]] = tuple(sorted({*aside.get(r["ready.variant_id"], ()), r["ready.seed"] or 0}))
    marked = runs.with_columns(pl.when(not_lossless(runs)).then(pl.lit(NOT_LOSSLESS)).otherwise(pl.col("status"))
                               .alias("status"))
    return marked, aside


def search_objective(sweep: str, experiments_dir: Optional[Path] = None) -> Optional[str]:
    """The metric a search sweep's TPE trials maximise (`search.objective` of experiments/<sweep>.yaml,
    default `overall/tau` as in sweeps/spec.py); None for a sweep without a search or spec file."""
    from omegaconf import OmegaConf

    path = (experiments_dir or EXPERIMENTS_DIR) / f"{sweep}.yaml"
    try:
        spec = OmegaConf.to_container(OmegaConf.load(path))
    except (OSError, ValueError):
        return None
    search = spec.get("search") if isinstance(spec, dict) else None
    if not isinstance(search, dict):
        return None
    return str(search.get("objective") or "overall/tau")


def slim(evaluation: dict) -> dict:
    """The evaluation without per-prompt token ids (`tokens` -> `n_tokens`), all the statistics need:
    a run's ids can be megabytes, and a report holds every run of a sweep."""
    for bench in (evaluation.get("benchmarks") or {}).values():
        if not isinstance(bench, dict):
            continue
        for records in (bench.get("prompts"), (bench.get("state_swap") or {}).get("prompts")):
            for rec in records or ():
                if isinstance(rec, dict) and isinstance(rec.get("tokens"), list):
                    rec["n_tokens"] = len(rec.pop("tokens"))
    return evaluation


def load_evaluations(tracking_uri: str, runs: pl.DataFrame, cache_dir: Optional[Path] = None,
                     echo: Callable[[str], None] = lambda _msg: None, write_cache: bool = True) -> dict[str, dict]:
    """Run id -> the run's evaluation.json (per-prompt decoding logs, `slim`med), for every finished run.

    Artifacts are downloaded through MLflow once and kept, slimmed, under `cache_dir/<run id>.json`
    (a finished run's artifact never changes); `write_cache` False reads that cache but adds nothing
    to it (a command that only reads). A run without the artifact (older runs) is left out; tables
    then show gains without intervals and say so.
    """
    from ready.artifacts import atomic_write_text

    out: dict[str, dict] = {}
    ids = runs.filter(pl.col("status") == FINISHED)["run_id"].to_list()
    client = None
    for run_id in ids:
        cached = cache_dir / f"{run_id}.json" if cache_dir is not None else None
        try:
            if cached is not None and cached.is_file():
                out[run_id] = json.loads(cached.read_text())
                continue
            if client is None:
                os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
                client = _client(tracking_uri)
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    text = Path(client.download_artifacts(run_id, EVALUATION, tmp)).read_text()
                except Exception:  # no such artifact: an older run, or one that failed to log it
                    continue
            out[run_id] = slim(json.loads(text))
            if cached is not None and write_cache:
                atomic_write_text(cached, json.dumps(out[run_id]))
        except (OSError, ValueError) as e:
            echo(f"run {run_id}: {EVALUATION} unreadable ({type(e).__name__}: {str(e)[:120]}); no intervals from it")
    return out


def aggregate(runs: pl.DataFrame) -> list[Variant]:
    """Group runs by `ready.variant_id`: mean ± std over finished seeds, ordered by `ready.order`.

    A re-run of the same (variant, seed) counts once (the latest finished one). Variants whose runs
    all failed or are still running appear with no seeds, so tables can show them as missing.
    """
    metrics = metric_columns(runs)
    fin = finished(runs)
    aggs = [pl.col("ready.seed").sort().alias("seeds")]
    for m in metrics:
        aggs += [pl.col(m).mean().alias(f"{m}\0mean"), pl.col(m).std().alias(f"{m}\0std"), pl.col(m).count().alias(f"{m}\0n")]
    stats = {r["ready.variant_id"]: r for r in fin.group_by("ready.variant_id").agg(aggs).iter_rows(named=True)}
    all_seeds = set(runs["ready.seed"].drop_nulls().to_list())

    info = (
        runs.sort(["status", "start_time"], descending=[False, False])
        .group_by("ready.variant_id", maintain_order=True)
        .agg(
            pl.col("ready.method").drop_nulls().first(),
            pl.col("ready.label").drop_nulls().first(),
            pl.col("ready.order").drop_nulls().min(),
            pl.col("ready.model").drop_nulls().first(),
            pl.col("status").filter(pl.col("status") != FINISHED).alias("unfinished"),
        )
    )
    out = []
    for r in info.iter_rows(named=True):
        s = stats.get(r["ready.variant_id"])
        seeds = tuple(x for x in (s["seeds"] if s else []) if x is not None)
        st, counts = {}, {}
        if s:
            for m in metrics:
                counts[m] = int(s[f"{m}\0n"])
                if s[f"{m}\0mean"] is not None:
                    st[m] = Stat(s[f"{m}\0mean"], s[f"{m}\0std"], counts[m])
        if s and not seeds:  # finished runs without a seed tag still count as one each
            seeds = tuple(range(int(fin.filter(pl.col("ready.variant_id") == r["ready.variant_id"]).height)))
        out.append(
            Variant(
                variant_id=r["ready.variant_id"],
                method=(r["ready.method"] or "").lower(),
                label=r["ready.label"] or "",
                order=r["ready.order"],
                model=r["ready.model"],
                seeds=seeds,
                missing_seeds=tuple(sorted(all_seeds - set(seeds))) if seeds else (),
                unfinished=tuple(r["unfinished"] or ()),
                stats=st,
                counts=counts,
            )
        )
    big = 1 << 62
    return sorted(out, key=lambda v: (v.order if v.order is not None else big, v.name))


def latest_setting(runs: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """Keep the runs of the sweep setting that ran last; a message when older settings were dropped.

    One experiment can hold several settings of a sweep (say a smoke run, then the full one);
    each has its own baselines, so a table never mixes them.
    """
    settings = runs["ready.setting"].drop_nulls().unique()
    if len(settings) < 2:
        return runs, None
    latest = runs.filter(pl.col("ready.setting").is_not_null()).sort("start_time", nulls_last=False)["ready.setting"][-1]
    kept = runs.filter(pl.col("ready.setting") == latest)
    older = sorted(set(settings.to_list()) - {latest})
    msg = (f"{len(settings)} settings in the store; reporting the latest, {latest} ({kept.height} runs); "
           f"left out: {', '.join(older)}")
    return kept, msg


def short_model(name: str) -> str:
    """A checkpoint path as its folder name; a preset name as it is."""
    return Path(name.rstrip("/")).name if "/" in name else name


def models(runs: pl.DataFrame) -> list[str]:
    """Distinct `ready.model` tags of the finished runs (paths shortened to their last part)."""
    fin = runs.filter(pl.col("status") == FINISHED)
    return sorted({short_model(m) for m in fin["ready.model"].drop_nulls().to_list()})


def seed_counts(variants: Iterable[Variant]) -> tuple[int, int]:
    """(min, max) number of finished seeds over variants that finished at least one."""
    ns = [v.n_finished for v in variants if v.n_finished]
    return (min(ns), max(ns)) if ns else (0, 0)
