"""`python -m reports.findings`: the paper's five ablation findings, checked against this store.

    python -m reports.findings                       # Markdown to stdout
    python -m reports.findings --out FILE            # keeps FILE's hand-written text above MARKER
    python -m reports.findings --profile state_context  # the same findings where the reader has state information

`--profile NAME` reads the sweeps as run with `profile=NAME` (`python -m sweeps.run rank
profile=state_context`: the positive control's setting); without it, as run without a profile. The
positive control is read as its spec runs it, whatever `--profile` says.

Each finding names the sweep that tests it, the paper's figure, and the paired comparisons that
decide it: row A against row B of the same sweep setting, seed by seed and prompt by prompt, as a
gain in τ (%) with its 95 % interval (`reports.intervals`, `reports.stats`: every suite's prompts
pooled, the closed-form crossed seeds × prompts interval), on the evaluation suites (`overall`) and
teacher-forced on held-out regenerated sequences (`heldout_tf`), and with the comparison's minimum
detectable effect (MDE) at 80 % power. The verdict reads the engine-τ comparison only, and first
asks whether it is thin:

- a thin comparison (fewer than `reports.stats.MIN_DISCORDANT` differing units) has no interval, MDE
  or TOST: the exact sign test on its differing units decides a direction (p < 0.05) or nothing;
  an absence claim on it is inconclusive, unless the sign test shows the placebo beating its
  reference (then it does not hold);
- a directional claim ("A beats B") reproduces when its interval lies above 0, does not when it
  lies below 0, and is inconclusive otherwise;
- an absence claim ("the placebo does not beat FT", "full rank adds little over r = 8") has three
  outcomes: it reproduces (holds) only by two one-sided tests (TOST, level 0.05) that the gain lies
  within ± its declared margin (`Comparison.margin`), and only when that margin is at least the
  comparison's MDE; it does not reproduce when the interval lies wholly outside the margin (above
  +margin or below -margin; the placebo's claim also fails when the interval lies above 0);
  otherwise it is inconclusive;
- a finding reproduces only when every one of its claims does (an intersection-union test: each
  at level 0.05, no multiplicity correction needed);
- a finding about how the reader should be built (rank, source layers, injection) is only worth
  something when the reader shows a state effect at all: its precondition comparison (the default
  ReaDy row above the state placebo) must clear 0, or the finding reads "vacuous" instead of
  "reproduces" (a rank cannot matter, and a layer cannot win on state information, for a reader
  that has not been shown to read anything);
- when the engine's interval and the teacher-forced one both exclude 0 but with opposite signs, the
  comparison is "inconclusive" (the two metrics disagree).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ready.config import entry_point
from reports import stats
from reports import collect
from reports.errors import ReportError
from reports.intervals import Evidence
from reports.stats import Interval

MARKER = "<!-- generated below by python -m reports.findings; hand-written text above this line is kept -->"
SATURATION_PCT = 1.0  # "near saturation": the full-rank gain over r = 8 lies within ±1 % τ
NULL_PCT = 1.0  # "no state effect": the placebo's gain over FT lies within ±1 % τ


@dataclass(frozen=True)
class Comparison:
    row: str  # a row label of the sweep (tag ready.label)
    ref: str  # the row it is compared with
    # "above": row beats ref; "below": row loses to ref; "saturated": gain within ±margin (full rank);
    # "null": gain within ±margin, and row must not beat ref (the placebo); "info": shown for context,
    # not judged; "precondition": like "above", but what it guards is a null/saturation claim
    claim: str = "above"
    margin: float = 0.0  # declared equivalence margin in % τ ("saturated", "null"); 0: the claim's default

    @property
    def bound(self) -> float:
        """The equivalence margin of an absence claim (SATURATION_PCT / NULL_PCT unless declared)."""
        return self.margin or (SATURATION_PCT if self.claim == "saturated" else NULL_PCT)


@dataclass(frozen=True)
class Finding:
    title: str
    sweep: str
    paper: str
    comparisons: tuple[Comparison, ...]


POSITIVE_CONTROL = Finding(
    "Positive control: the pipeline sees state information when it is there", "positive_control",
    "not in the paper; the drafter's context is cut to the token embeddings of the last committed token "
    "(experiments/profiles/state_context.yaml), so that everything older reaches the drafter only through "
    "the states: ReaDy must beat FT, the placebo must not",
    (Comparison("ReaDy", "DSpark + FT"), Comparison("Placebo (shuffled states)", "DSpark + FT", "null"),
     Comparison("ReaDy", "Placebo (shuffled states)"), Comparison("ReaDy", "DSpark", "info"),
     Comparison("DSpark + FT", "DSpark", "info")))

FINDINGS = (
    Finding("Fine-tuning alone gives only a small part of the gain", "ft_control",
            "DSpark + FT +2.38 % τ, ReaDy +8.50 % τ over DSpark (Table 2)",
            (Comparison("ReaDy", "DSpark + FT"), Comparison("ReaDy", "Placebo (shuffled states)"),
             Comparison("ReaDy", "DSpark"), Comparison("DSpark + FT", "DSpark", "info"))),
    Finding("Rank 8 is near saturation", "rank",
            "full rank (r = 128) adds +0.0119 τ (+0.26 %) over r = 8 (Table 3)",
            (Comparison("r=128", "r=8", "saturated"), Comparison("r=8", "Placebo (shuffled states)", "precondition"),
             Comparison("r=8", "DSpark + FT", "info"))),
    Finding("Layer 62 is the best single source, (30, 62) the best set, adding layer 2 hurts", "layers",
            "{62} > {30}, {2}; {30,62} best; {2,30,62} < {30,62} (Table 4)",
            (Comparison("{62}", "{30}"), Comparison("{62}", "{2}"), Comparison("{30,62}", "{62}"),
             Comparison("{2,30,62}", "{30,62}", "below"),
             Comparison("{30,62}", "Placebo (shuffled states)", "precondition"))),
    Finding("Injecting once, in the last draft layer, is best", "inject_layer",
            "{last} > {0}, {0,last}, all (Table 5)",
            (Comparison("{last}", "{0}"), Comparison("{last}", "{0,last} = all"),
             Comparison("{last}", "Placebo (shuffled states)", "precondition"))),
    Finding("Post-attention injection beats pre-attention", "inject_pos",
            "post-attention > pre-attention (Table 6)",
            (Comparison("post-attention", "pre-attention"),
             Comparison("post-attention", "Placebo (shuffled states)", "precondition"))),
)


def _fmt(iv: Optional[Interval]) -> str:
    if iv is None:
        return "—"
    if iv.thin:  # too few differing units for an interval: the count and the sign test
        return (f"{iv.value:+.2f} ({iv.discordant} of {iv.units:,} units differ, {iv.ahead} ahead; "
                f"sign test p {iv.sign_p:.2g})")
    return f"{iv.value:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}]"


def _mde(iv: Optional[Interval]) -> str:
    if iv is None:
        return "—"
    if iv.thin:
        return "— (thin)"
    df = "∞" if not math.isfinite(iv.df) else f"{iv.df:.1f}"
    return f"{iv.mde():.2f} (df {df})"


def _sign(iv: Interval) -> int:
    """+1 / -1 when the exact sign test on a thin comparison's differing units shows the row ahead / behind
    at level ALPHA, else 0."""
    if iv.sign_p >= stats.ALPHA:
        return 0
    return 1 if 2 * iv.ahead > (iv.discordant or 0) else -1


def judge(c: Comparison, iv: Optional[Interval]) -> Optional[str]:
    """reproduces / does not / inconclusive for one comparison (None for an informational row); thinness is
    checked first (module docstring)."""
    if c.claim == "info":
        return None
    if iv is None:
        return "not run"
    absence = c.claim in ("null", "saturated")
    if iv.thin:
        shown = _sign(iv)
        if absence:
            return "does not" if c.claim == "null" and shown > 0 else "inconclusive"
    elif absence:
        m = c.bound
        if iv.lo > m or iv.hi < -m or (c.claim == "null" and iv.lo > 0):
            return "does not"
        if m < iv.mde() or iv.tost_p(m) >= stats.ALPHA:
            return "inconclusive"
        return "reproduces"
    else:
        shown = 1 if iv.lo > 0 else (-1 if iv.hi < 0 else 0)
    direction = shown * (-1 if c.claim == "below" else 1)
    return "reproduces" if direction > 0 else ("does not" if direction < 0 else "inconclusive")


def reason(c: Comparison, iv: Optional[Interval]) -> str:
    """Why an absence claim holds, fails or is inconclusive (thinness, margin, MDE, TOST p); "" otherwise."""
    if iv is None or c.claim not in ("null", "saturated"):
        return ""
    if iv.thin:
        return (f"thin: {iv.discordant} of {iv.units:,} units differ; an exact sign test decides a direction, "
                "not equivalence")
    if judge(c, iv) == "does not":
        return f"interval outside ±{c.bound:g} %" if (iv.lo > c.bound or iv.hi < -c.bound) else "interval above 0"
    mde = iv.mde()
    if c.bound < mde:
        return f"MDE {mde:.2f} % > margin ±{c.bound:g} %: too little data to show no effect"
    return f"TOST at ±{c.bound:g} %: p {iv.tost_p(c.bound):.3f}"


def reconcile(verdict: Optional[str], engine: Optional[Interval], tf: Optional[Interval]) -> Optional[str]:
    """A decided verdict becomes "inconclusive" when the teacher-forced interval clears 0 on the other
    side of the engine's (both metrics certain, and opposed)."""
    if verdict not in ("reproduces", "does not") or engine is None or tf is None:
        return verdict
    engine_sign = _sign(engine) if engine.thin else (1 if engine.lo > 0 else (-1 if engine.hi < 0 else 0))
    tf_sign = 1 if tf.lo > 0 else (-1 if tf.hi < 0 else 0)
    return "inconclusive" if engine_sign * tf_sign < 0 else verdict


def overall_verdict(verdicts: Sequence[Optional[str]], preconditions: Sequence[Optional[str]] = ()) -> str:
    """One finding's verdict from its comparisons' verdicts; `preconditions` are the verdicts of its
    precondition comparisons: a finding whose claims all reproduce but whose reader showed no state
    effect is "vacuous" (a rank cannot matter to a reader that reads nothing)."""
    vs = [v for v in verdicts if v is not None]
    if not vs or "not run" in vs or "not run" in preconditions:
        return "not run"
    if "does not" in vs:
        return "does not reproduce"
    if not all(v == "reproduces" for v in vs):
        return "inconclusive"
    return "reproduces" if all(v == "reproduces" for v in preconditions) else "vacuous (no state effect shown)"


def control_verdict(verdict: str) -> str:
    """A control passes or it does not: "inconclusive" would read as if it had half passed."""
    return "passed" if verdict == "reproduces" else f"not passed ({verdict})"


def store_for(sweep: str, tracking_uris: Sequence[str]) -> str:
    """The first store that holds the sweep (the first store when none does: its error names it)."""
    for uri in tracking_uris:
        try:
            if sweep in collect.list_sweeps(uri):
                return uri
        except ReportError:
            continue
    return tracking_uris[0]


def profile_runs(runs: Any, sweep: str, profile: Optional[str]) -> Any:
    """The runs of `sweep` made with `profile=profile` (None: made without one), latest setting first."""
    runs = runs.filter(runs["ready.profile"].fill_null("") == (profile or ""))
    if runs.height == 0:
        raise ReportError(f"sweep {sweep!r} has no runs made with profile={profile}" if profile else
                          f"sweep {sweep!r} has no runs made without a profile")
    return collect.latest_setting(runs)[0]


def finding_section(finding: Finding, tracking_uris: Sequence[str], cache_dir: Optional[Path],
                    profile: Optional[str] = None, suite: Optional[str] = None, write_cache: bool = True) -> str:
    """One finding as Markdown: the paper's figure, a table of paired gains, the verdict. `profile`:
    read the sweep's runs made with that profile (the positive control: its spec's, always). `suite`:
    the engine gains on that benchmark's prompts only (default every suite's, pooled)."""
    key = suite or stats.OVERALL
    head = [f"## {finding.title}", "", f"Paper: {finding.paper}.", ""]
    tracking_uri = store_for(finding.sweep, tracking_uris)
    control = finding is POSITIVE_CONTROL
    try:
        runs = collect.load_runs(tracking_uri, finding.sweep)
        runs = collect.latest_setting(runs)[0] if control else profile_runs(runs, finding.sweep, profile)
    except ReportError as e:
        return "\n".join(head + [f"**Verdict: not run** — {e}", ""])
    evidence = Evidence(runs, collect.load_evaluations(tracking_uri, runs, cache_dir, write_cache=write_cache))
    variants = {v.name: v for v in collect.aggregate(runs)}
    names = {v.variant_id: v.name for v in variants.values()}

    def label(v: Any) -> str:  # "r=128 (= r=64: rank 128 clamped to d_k = 64)" for a row that is another's drafter
        return evidence.clone_label(v, names)

    rows, verdicts, preconditions, notes = [], [], [], []
    for c in finding.comparisons:
        a, b = variants.get(c.row), variants.get(c.ref)
        if a is None or b is None:
            missing = c.row if a is None else c.ref
            rows.append(f"| {c.row} vs {c.ref} | — | — | — | — | "
                        f"row {missing!r} not in sweep {finding.sweep} |")
            (preconditions if c.claim == "precondition" else verdicts).append(judge(c, None))
            continue
        engine, note = evidence.gain(a, b, key)
        tf, _ = evidence.gain(a, b, stats.HELDOUT_TF)
        counts = evidence.counts(a, key)
        n = f"{counts.seeds} × {counts.prompts} × {counts.rounds:,}" if counts else "—"
        verdict = judge(c, engine)
        if reconcile(verdict, engine, tf) != verdict:
            verdict = "inconclusive"
            notes.append(f"{c.row} vs {c.ref}: the engine and teacher-forced intervals exclude 0 with opposite signs")
        (preconditions if c.claim == "precondition" else verdicts).append(verdict)
        claim = {"above": "> 0", "below": "< 0", "saturated": f"within ±{c.bound:g} %",
                 "null": f"within ±{c.bound:g} %, not > 0", "info": "(context)",
                 "precondition": "> 0 (precondition)"}[c.claim]
        why = reason(c, engine)
        rows.append(f"| {label(a)} vs {label(b)} | {_fmt(engine)} | {_mde(engine)} | {_fmt(tf)} | {n} | "
                    f"{claim}: {verdict or '—'}{f' ({why})' if why else ''} |")
        if note:
            notes.append(note)
    table = ["| comparison | Δτ engine (%) [95 % CI] | MDE 80 % (df) | Δτ teacher-forced (%) [95 % CI] | "
             "seeds × prompts × rounds | claim: verdict |", "|---|---|---|---|---|---|", *rows]
    out = head + table + [""] + [f"- {n}" for n in notes] + (["" ] if notes else [])
    verdict = overall_verdict(verdicts, preconditions)
    if control:
        verdict = control_verdict(verdict)
    run = f"python -m sweeps.run {finding.sweep}" + (f" profile={profile}" if profile and not control else "")
    regen = "python -m reports.findings" + (f" --profile {profile}" if profile else "") + (f" --suite {suite}" if suite else "")
    out += [f"**Verdict: {verdict}.** Regenerate: `{regen}` (sweep `{finding.sweep}`: `{run}`).", ""]
    return "\n".join(out)


def render(tracking_uris: Sequence[str], cache_dir: Optional[Path] = None, profile: Optional[str] = None,
           suite: Optional[str] = None, write_cache: bool = True) -> str:
    where = (f"in the setting of profile `{profile}` (experiments/profiles/{profile}.yaml; every sweep run as "
             f"`python -m sweeps.run NAME profile={profile}`)" if profile else "on the embedded default")
    if suite:
        where += f", engine gains on suite `{suite}` only"
    intro = (f"# The paper's ablation findings {where}\n\n"
             "Generated by `python -m reports.findings` from the MLflow store; every gain pools every suite's "
             "prompts (τ = 1 + Σ_j P_j, censored at the token budget) and is paired (same prompts, same seeds) "
             "with a closed-form 95 % interval: the seed level on seeds − 1 df plus the prompt level on prompts − "
             "suites df (docs/sweeps.md). MDE: the smallest true gain the comparison detects with 80 % power. A "
             f"comparison on fewer than {stats.MIN_DISCORDANT} differing units is thin: no interval, MDE or TOST, "
             "only the exact sign test. \"No effect\" and \"saturated\" hold only by two one-sided tests within a "
             "declared margin that is at least the MDE, do not hold when the interval lies outside the margin, and "
             "are inconclusive otherwise. Verdict rules: `reports/findings.py`.\n")
    sections = [finding_section(f, tracking_uris, cache_dir, profile, suite, write_cache)
                for f in (POSITIVE_CONTROL, *FINDINGS)]
    return "\n".join([intro] + sections)


def with_preface(out: Path, text: str) -> str:
    """`text` below the hand-written part of `out` (what lies above MARKER), so regenerating the
    tables never erases the reading written around them."""
    old = out.read_text() if out.is_file() else ""
    if MARKER not in old:
        return text
    return old.split(MARKER)[0] + MARKER + "\n\n" + text


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reports.findings", description=__doc__.split("\n")[0])
    p.add_argument("--tracking-uri", action="append", default=None,
                   help="MLflow store; repeat it when the sweeps ran into several (default $MLFLOW_TRACKING_URI "
                        "or sqlite:///mlflow.db)")
    p.add_argument("--profile", default=None,
                   help="read the sweeps as run with profile=NAME (default: as run without a profile)")
    p.add_argument("--suite", default=None,
                   help="engine gains on this benchmark's prompts only (e.g. humaneval; default every suite pooled)")
    p.add_argument("--out", default=None, help="write the Markdown here instead of stdout")
    p.add_argument("--cache-dir", default="reports/out/.cache/evaluations",
                   help="where downloaded evaluation.json files are kept (read; written only with --out)")
    args = p.parse_args(argv)
    uris = args.tracking_uri or [collect.default_tracking_uri()]
    try:  # a missing or unreadable store is one line before any verdict (and before --out is touched)
        held = {uri: collect.list_sweeps(uri) for uri in uris}
        if not any(f.sweep in names for names in held.values() for f in (POSITIVE_CONTROL, *FINDINGS)):
            raise ReportError(f"tracking URI {', '.join(repr(u) for u in uris)}: none of the findings' sweeps "
                              f"({', '.join(sorted({f.sweep for f in (POSITIVE_CONTROL, *FINDINGS)}))}) is there; "
                              "expected the store the sweeps wrote (run `python -m sweeps.run NAME` first)")
        text = render(uris, Path(args.cache_dir), args.profile, args.suite,
                      write_cache=bool(args.out))  # without --out it only reads: it writes nothing
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        from ready.artifacts import atomic_write_text

        atomic_write_text(args.out, with_preface(Path(args.out), text))
        print(f"[findings] wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
