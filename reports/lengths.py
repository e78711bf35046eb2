"""Decoding against the context length (issue 46 item 1): decode tok/s of AR, DSpark and ReaDy, and what
reading the states costs, against the prompt length, from the engine benchmark's JSON.

    python -m benchmarks.engine --target qwen3_5_27b drafter.proposals=7 --drafter dspark,ready \\
        --breakdown --accept-dist 0:0.15,1:0.1,2:0.1,3:0.1,4:0.1,5:0.1,6:0.1,7:0.25 --json \\
        --prompt-len 1024,8192,32768 --out lengths.json
    python -m reports.lengths lengths.json --out docs/img/lengths_h200     # writes .pdf and .png

Left panel: decode tok/s of each method, and AR's bound (the weights and the K/V an AR step must read,
at the bandwidth the JSON names). Right panel: the readers alone in a CUDA graph (µs per draft step) and
ReaDy's draft less DSpark's with its 95 % interval over the benchmark's ABBA pairs. A length whose
drafters did not run (out of memory, cut by a time limit) keeps its AR point only. Several files may be
given (e.g. one process per length); they must come from one GPU, and a length given twice is an error.
Prints the plotted figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ready.config import entry_point
from reports.errors import ReportError
from reports.figures import save_figure


@dataclass(frozen=True)
class LengthPoint:
    """One prompt length's figures (None where the benchmark did not measure them)."""

    prompt_len: int
    ar_tps: float
    ar_bound_tps: Optional[float]  # weights + K/V at the JSON's bandwidth
    dspark_tps: Optional[float]
    ready_tps: Optional[float]
    readers_us: Optional[float]  # the readers alone in a CUDA graph, per draft step
    extra_draft_us: Optional[tuple[float, float, float]]  # ReaDy - DSpark draft µs: mean, 95 % lo, hi


def _entries(doc: Any, source: str) -> list[dict]:
    """The per-length entries of one engine JSON (a multi-length run keeps them under `by_prompt_len`)."""
    entries = doc.get("by_prompt_len", [doc]) if isinstance(doc, dict) else None
    if not entries or not all(isinstance(e, dict) and "prompt_len" in e
                              and "decode_tokens_per_s" in (e.get("ar") or {}) for e in entries):
        raise ReportError(f"{source}: not the JSON of `python -m benchmarks.engine` (expected `prompt_len` and "
                          f"`ar.decode_tokens_per_s` per length, or `by_prompt_len`)")
    return entries


def _point(e: dict) -> LengthPoint:
    bound = (e.get("bound") or {}).get("step_ms_with_kv")
    drafters = e.get("drafters") or {}
    run = (drafters.get("runs") or [{}])[0]
    extra = (run.get("ready_minus_dspark_us") or {}).get("draft_us")
    tps = lambda m: (run.get(m) or {}).get("decode_tokens_per_s")  # noqa: E731
    return LengthPoint(
        prompt_len=int(e["prompt_len"]), ar_tps=float(e["ar"]["decode_tokens_per_s"]),
        ar_bound_tps=1e3 / bound if bound else None, dspark_tps=tps("dspark"), ready_tps=tps("ready"),
        readers_us=(drafters.get("reader") or {}).get("readers_us"),
        extra_draft_us=(extra["mean"], extra["lo"], extra["hi"]) if extra else None)


def load_points(paths: Sequence[Path]) -> tuple[str, Optional[float], list[LengthPoint]]:
    """(the GPU, the bound's bandwidth in bytes/s, the points by length) of engine JSON files."""
    gpus: dict[str, str] = {}
    bandwidth: Optional[float] = None
    points: dict[int, LengthPoint] = {}
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ReportError(f"{path}: cannot read it as JSON ({type(e).__name__}: {e})") from None
        for e in _entries(doc, str(path)):
            gpus.setdefault(str(e.get("gpu", "unknown")), str(path))
            p = _point(e)
            if p.prompt_len in points:
                raise ReportError(f"{path}: prompt length {p.prompt_len} is given twice; pass one file per length")
            points[p.prompt_len] = p
            bandwidth = (e.get("bound") or {}).get("bandwidth_bytes_per_s", bandwidth)
    if len(gpus) > 1:
        raise ReportError("the files come from different GPUs (" + "; ".join(f"{g} in {f}" for g, f in gpus.items())
                          + "): one figure compares one GPU's lengths")
    return next(iter(gpus)), bandwidth, [points[n] for n in sorted(points)]


def plot(points: list[LengthPoint], gpu: str, bandwidth: Optional[float], out_stem: Path) -> list[Path]:
    """The two panels; writes `<stem>.pdf` and `<stem>.png` atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [p.prompt_len for p in points]
    fig, (tps, us) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    series = (("AR", "ar_tps", dict(color="0.3", marker="s")),
              ("DSpark", "dspark_tps", dict(color="0.55", marker="^", linestyle="--")),
              ("ReaDy", "ready_tps", dict(color="tab:red", marker="o")))
    for label, field, style in series:
        xy = [(p.prompt_len, getattr(p, field)) for p in points if getattr(p, field) is not None]
        if xy:
            tps.plot(*zip(*xy), label=label, **style)
    bound = [(p.prompt_len, p.ar_bound_tps) for p in points if p.ar_bound_tps]
    if bound:
        rate = f" at {bandwidth / 1e12:.2f} TB/s" if bandwidth else ""
        tps.plot(*zip(*bound), color="0.3", linestyle=":", label=f"AR bound (weights + K/V{rate})")
    top = max(v for p in points for v in (p.ar_tps, p.ar_bound_tps, p.dspark_tps, p.ready_tps) if v is not None)
    tps.set(xlabel="prompt tokens", ylabel="decode tok/s", title="Decoding speed", ylim=(0, 1.45 * top))
    readers = [(p.prompt_len, p.readers_us) for p in points if p.readers_us is not None]
    if readers:
        us.plot(*zip(*readers), color="tab:blue", marker="D", label="readers alone (CUDA graph)")
    extra = [(p.prompt_len, p.extra_draft_us) for p in points if p.extra_draft_us is not None]
    if extra:
        xs = [x for x, _ in extra]
        mean, lo, hi = ([e[i] for _, e in extra] for i in range(3))
        us.errorbar(xs, mean, yerr=[[m - a for m, a in zip(mean, lo)], [b - m for m, b in zip(mean, hi)]],
                    color="tab:red", marker="o", capsize=3, label="ReaDy - DSpark draft (95 %)")
    us.axhline(0.0, color="0.7", linewidth=0.8)
    us.set(xlabel="prompt tokens", ylabel="µs per draft step", title="Reading the states")
    for ax in (tps, us):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.minorticks_off()
    tps.legend(fontsize=7, loc="upper center", ncol=2)  # in the room left above the lines
    if us.get_legend_handles_labels()[0]:
        us.legend(fontsize=7)
    fig.suptitle(gpu, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_stem)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reports.lengths", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON of `python -m benchmarks.engine --prompt-len ...`")
    p.add_argument("--out", type=Path, required=True, help="figure path without suffix (.pdf and .png are written)")
    args = p.parse_args(argv)
    try:
        gpu, bandwidth, points = load_points(args.files)
        written = plot(points, gpu, bandwidth, args.out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"gpu": gpu, "points": [asdict(p) for p in points], "written": [str(w) for w in written]},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
