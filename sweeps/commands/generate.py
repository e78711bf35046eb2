"""Generate with the target, greedily, autoregressively or with a drafter.

    python -m sweeps.commands.generate --target tiny --method ngram --prompt-ids 1,2,3 --max-new-tokens 32 --json
    python -m sweeps.commands.generate --target default --method ngram --prompt "def parse(" drafter.proposals=6
    python -m sweeps.commands.generate --target DIR --drafter DRAFTER_DIR --method dspark --prompts prompts.jsonl \
        --max-new-tokens 256 --json --check-lossless target.device=cuda eval.verify_schedule=confidence

The typed config is the command line (ready/config.py, experiments/base.yaml): every `a.b=v` argument is an
override of it, parsed and checked as `python -m sweeps.run` does (a misspelled key or a bad value is one
line naming it). The command reads `target.dtype`, `target.device`, `drafter.proposals` (the ngram drafter's
K; a checkpoint drafter's K is its own), `eval.max_new_tokens`, `eval.exact`, `eval.warmup_rounds` and the
verify schedule (`eval.verify_schedule`, `eval.confidence_threshold`, `eval.verify_budget`); `--target
default` builds the embedded default target from the same config (`pretrain.*`, `corpus.*`, `threads.shared`,
`artifacts_dir`). `--max-new-tokens N` is `eval.max_new_tokens=N` and `--drafter DIR` is
`drafter.checkpoint=DIR` (give one of the two). The flags that restated config keys are gone: `-k N` is
`drafter.proposals=N`, `--device D` `target.device=D`, `--dtype T` `target.dtype=T`, `--exact` / `--no-exact`
`eval.exact=on` / `off`, `--warmup N` `eval.warmup_rounds=N` (each says so when given).

`--target` is a preset (`tiny`, `qwen3_5_27b`: random weights), `default` (the embedded target
pretrained on the stdlib corpus, built and cached on first use), or a Hugging Face checkpoint
directory (its tokenizer, when present, encodes `--prompt` and decodes the output).
`--prompts FILE.jsonl`: one prompt per line, an object with `prompt_ids` (token ids) or `prompt`
/ `text` (a string), or a bare JSON string or list of ids. TPS and the clock are defined in
`ready.metrics`.

`--check-lossless` also decodes with AR and reports `lossless_exact` (identical to AR),
`greedy_valid` (every token the target's greedy choice up to the tie margin; `lossless` is this),
`tie_flips` and `min_margin` (ready.decode.evaluate, docs/sweeps.md "Lossless"). `eval.exact=on` runs the
target in exact mode (verify and the AR step bit-identical, so lossless_exact holds in 16-bit too; `auto`, the
default, is on for a bfloat16/float16 target). Exit status 3: not greedy-valid, or not identical to AR in
exact mode.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

import torch

from ready.config import ConfigError, entry_point, exact_mode, load_config, parse_override, replaced_flags
from ready.data.default import ensure_default_target
from ready.data.tokenizer import load_tokenizer
from ready.decode.engine import Engine
from ready.decode.rounds import as_prompt, check_prompt
from ready.decode.errors import DecodeError
from ready.decode.evaluate import evaluate, run_ar, schedule_record
from ready.decode.ngram import NgramDrafter
from ready.decode.schedule import schedule_from
from ready.health import check_target
from ready.metrics import summarize, tau as tau_of, tps as tps_of
from ready.target import load_target

METHODS = ("ar", "ngram", "dspark", "ready")
# the flags that restated config keys, and the override that says each now (ready.config.replaced_flags)
REPLACED = {"-k": "drafter.proposals", "--proposals": "drafter.proposals", "--device": "target.device",
            "--dtype": "target.dtype", "--exact": "eval.exact=on", "--no-exact": "eval.exact=off",
            "--warmup": "eval.warmup_rounds"}
# flags kept because printed commands use them, each the config key it sets: flag attribute -> key
ALIASES = {"max_new_tokens": "eval.max_new_tokens", "drafter": "drafter.checkpoint"}


class Parser(argparse.ArgumentParser):
    """argparse, with a bad option value answered in one line (exit 2) like every other input error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} ({self.prog} --help lists the options)\n")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    replaced_flags(argv, REPLACED)
    p = Parser(prog="python -m sweeps.commands.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="overrides of the typed config (ready/config.py), e.g. drafter.proposals=6 target.device=cuda")
    p.add_argument("--target", required=True, help="preset name, 'default', or a checkpoint directory")
    p.add_argument("--drafter", help="drafter checkpoint directory (methods dspark and ready; = drafter.checkpoint=DIR)")
    p.add_argument("--method", required=True, choices=METHODS)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer beside the target)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, e.g. 1,2,3")
    src.add_argument("--prompts", help="JSONL file, one prompt per line")
    p.add_argument("--max-new-tokens", type=int, help="the token budget of each prompt (= eval.max_new_tokens=N)")
    p.add_argument("--ngram-max", type=int, default=3, help="longest n-gram the ngram drafter looks up")
    p.add_argument("--eos-id", type=int, help="stop token (default: the target config's eos_token_id)")
    p.add_argument("--check-lossless", action="store_true",
                   help="also decode with AR: lossless_exact (token for token) and greedy_valid (up to the tie margin)")
    p.add_argument("--tie-margin", type=float, default=None,
                   help="greedy_valid's tie margin relative to max(|top-1 logit|, logit std) (default: per dtype, "
                        "ready.decode.evaluate.TIE_REL)")
    p.add_argument("--seed", type=int, default=0, help="seed for the random weights of a preset target (default 0)")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own choice)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p.parse_intermixed_args(argv)


def run_config(args: argparse.Namespace) -> Any:
    """The run's typed config: base.yaml <- the `a.b=v` overrides <- the kept flags (`ALIASES`: a flag and its
    key's override together are one ConfigError). Checked as every entry point's config is (`load_config`)."""
    keys = {parse_override(t)[0]: t for t in args.overrides}
    layers = []
    for attr, key in ALIASES.items():
        value = getattr(args, attr)
        if value is None:
            continue
        flag = "--" + attr.replace("_", "-")
        if key in keys:
            raise ConfigError(f"{flag} {value} and {keys[key]}: the flag sets that key; give one of the two")
        section, name = key.split(".")
        layers.append((flag, {section: {name: value}}))
    return load_config(overrides=args.overrides, layers=layers)


# --- inputs -----------------------------------------------------------------------------------------
def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise DecodeError(f"--prompt-ids {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    return ids


def read_prompts_file(path: str) -> list[Any]:
    """Each line: {"prompt_ids": [...]} | {"prompt"/"text": "..."} | [ids] | "text" (UTF-8 JSON)."""
    file = Path(path)
    if not file.is_file():
        raise DecodeError(f"--prompts {path}: no such file; expected a JSONL file with one prompt per line")
    out: list[Any] = []
    for n, raw_line in enumerate(file.read_bytes().splitlines(), start=1):
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"--prompts {path}, line {n}: byte {raw_line[e.start]:#04x} at column {e.start + 1} is "
                              "not UTF-8; expected UTF-8 JSON text") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DecodeError(f"--prompts {path}, line {n}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise DecodeError(f"--prompts {path}, line {n}: nested too deeply; expected a prompt object, list or "
                              "string") from None
        if isinstance(row, dict):
            key = next((k for k in ("prompt_ids", "input_ids", "ids", "prompt", "text") if k in row), None)
            row = row.get(key) if key else None
            if (key in ("prompt", "text")) != isinstance(row, str):
                row = None  # text keys hold a string, id keys a list of ints
        is_ids = isinstance(row, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in row)
        if not (isinstance(row, str) or is_ids):
            raise DecodeError(f"--prompts {path}, line {n}: expected an object with 'prompt_ids' (list of ints) or "
                              "'prompt'/'text' (string), a list of ints, or a string")
        out.append(row)
    if not out:
        raise DecodeError(f"--prompts {path}: the file holds no prompts")
    return out


def load_target_and_tokenizer(spec: str, cfg: Any) -> tuple[Any, Any, str]:
    """(target, tokenizer or None, resolved directory or preset name), in the config's device and dtype."""
    source = spec
    if spec == "default":  # the embedded default target of the run's config
        source = str(ensure_default_target(cfg))
    target = load_target(source, device=str(cfg.target.device), dtype=str(cfg.target.dtype))
    tokenizer = None
    path = Path(source)
    if path.is_dir() and ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
        tokenizer = load_tokenizer(path)
    return target, tokenizer, source


def encode_prompts(raw: list[Any], tokenizer: Any) -> list[list[int]]:
    out = []
    for item in raw:
        if isinstance(item, str):
            if tokenizer is None:
                raise DecodeError("a text prompt needs a tokenizer, and this target has none (no tokenizer.json beside "
                                  "the checkpoint); pass token ids with --prompt-ids or 'prompt_ids' in --prompts")
            item = tokenizer.encode(item, add_special_tokens=False)
        out.append(list(item))
    return out


def build_drafter(method: str, args: argparse.Namespace, cfg: Any, target: Any) -> Any:
    """None for AR, a prompt-lookup drafter of `drafter.proposals` for ngram, a loaded checkpoint
    (`--drafter`, i.e. `drafter.checkpoint`) for dspark/ready."""
    if method == "ar":
        return None
    if method == "ngram":
        return NgramDrafter(target.config.vocab_size, int(cfg.drafter.proposals), max_ngram=args.ngram_max)
    path = cfg.drafter.checkpoint
    if not path:
        raise DecodeError(f"--method {method} needs a drafter checkpoint (--drafter PATH), e.g. one written by the "
                          "training pipeline")
    try:
        from ready.drafter import load_drafter
    except ImportError as e:
        raise DecodeError(f"--method {method} needs the drafter package (ready.drafter), which failed to import: {e}") from None
    drafter = load_drafter(str(path), target).to(target.device).eval()
    has_reader = bool(getattr(drafter, "state_layers", []))
    if method == "ready" and not has_reader:
        raise DecodeError(f"--drafter {path} has no state reader (a DSpark checkpoint); use --method dspark, "
                          "or pass a ReaDy checkpoint")
    if method == "dspark" and has_reader:
        raise DecodeError(f"--drafter {path} has a state reader (a ReaDy checkpoint); use --method ready")
    return drafter


# --- run ----------------------------------------------------------------------------------------------
def check_args(args: argparse.Namespace) -> None:
    """Range checks of the command's own options that need no model: one DecodeError naming the option (the
    config's keys are checked by `load_config`)."""
    checks = [
        ("--ngram-max", args.ngram_max, args.ngram_max >= 1, "an integer >= 1"),
        ("--threads", args.threads, args.threads is None or args.threads >= 1, "an integer >= 1 (CPU threads)"),
        ("--eos-id", args.eos_id, args.eos_id is None or args.eos_id >= 0, "a token id >= 0"),
        ("--tie-margin", args.tie_margin, args.tie_margin is None or (math.isfinite(args.tie_margin)
                                                                      and args.tie_margin >= 0), "a finite number >= 0"),
        ("--seed", args.seed, 0 <= args.seed < 2**64, "an integer in 0 .. 2**64 - 1"),
    ]
    for option, value, ok, expected in checks:
        if not ok:
            raise DecodeError(f"{option} {value}; expected {expected}")


def run(args: argparse.Namespace, cfg: Any = None) -> dict[str, Any]:
    check_args(args)
    cfg = run_config(args) if cfg is None else cfg
    max_new_tokens = int(cfg.eval.max_new_tokens)
    if args.prompt_ids is not None:
        raw: list[Any] = [parse_prompt_ids(args.prompt_ids)]
    elif args.prompts is not None:
        raw = read_prompts_file(args.prompts)
    else:
        raw = [args.prompt]
    torch.manual_seed(args.seed)
    target, tokenizer, source = load_target_and_tokenizer(args.target, cfg)
    vocab = int(target.config.vocab_size)
    if args.eos_id is not None and args.eos_id >= vocab:
        raise DecodeError(f"--eos-id {args.eos_id}; expected a token id of the target (0..{vocab - 1})")
    prompts = encode_prompts(raw, tokenizer)
    for i, p in enumerate(prompts):
        try:
            check_prompt(target, as_prompt(p), max_new_tokens)
        except DecodeError as e:
            raise DecodeError(f"prompt {i}: {e}") from None
    check_target(target, prompts[0], what=f"target {source}")  # the sweeps' health check: no output from NaN
    drafter = build_drafter(args.method, args, cfg, target)
    exact = exact_mode(cfg)  # eval.exact; auto: on for a 16-bit target
    target.exact = exact
    warmup = int(cfg.eval.warmup_rounds)
    schedule = schedule_from(cfg.eval)
    k = drafter.proposals if drafter is not None else 0

    lossless = None
    if args.check_lossless:
        res = evaluate(target, drafter, prompts, max_new_tokens, benchmark="cli", method=args.method,
                       eos_token_id=args.eos_id, warmup=warmup, progress=False, tie_rel=args.tie_margin,
                       verify_schedule=schedule)
        gens = [dict(tokens=r.tokens, accepted=r.accepted, horizons=r.horizons, wall_s=r.wall_s, prompt_len=r.prompt_len,
                     lossless_exact=r.lossless_exact, tie_flips=r.tie_flips, min_margin=r.min_margin)
                for r in res.prompts]
        summary, lossless = res.metrics, {**res.validity(),
                                          "mismatch": None if res.mismatch is None else vars(res.mismatch)}
    else:
        if drafter is None:
            out = run_ar(target, prompts, max_new_tokens, eos_token_id=args.eos_id, warmup=warmup, progress=False)
        else:
            engine = Engine(target, drafter, eos_token_id=args.eos_id, verify_schedule=schedule)
            engine.reserve(max(len(p) for p in prompts) + max_new_tokens)  # no realloc while timed
            for _ in range(warmup):
                engine.generate(prompts[0], max_new_tokens)
            out = [engine.generate(p, max_new_tokens) for p in prompts]
        gens = [dict(tokens=g.tokens, accepted=g.accepted, horizons=g.horizons, wall_s=g.wall_s, prompt_len=g.prompt_len,
                     prefill_s=g.prefill_s, stop=g.stop) for g in out]
        summary = summarize([g.log() for g in out], "cli", args.method, k)

    results = []
    for i, g in enumerate(gens):
        results.append({
            "index": i,
            "prompt_len": g["prompt_len"],
            "token_ids": g["tokens"],
            "text": tokenizer.decode(g["tokens"]) if tokenizer is not None else None,
            "new_tokens": len(g["tokens"]),
            "tau": tau_of(g["accepted"], g["horizons"], k),
            "tps": tps_of(len(g["tokens"]), g["wall_s"]),
            "wall_s": g["wall_s"],
            "accepted": g["accepted"] if drafter is not None else [],
            "horizons": g["horizons"] if drafter is not None else [],
            **({k: g[k] for k in ("lossless_exact", "tie_flips", "min_margin")} if "tie_flips" in g else {}),
        })
    report: dict[str, Any] = {
        "target": source, "method": args.method, "proposals": k, "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""), "max_new_tokens": max_new_tokens, "exact": exact,
        **(schedule_record(schedule) if drafter is not None else {}), "results": results, "summary": summary.to_dict(),
    }
    if lossless is not None:
        report.update(lossless)
    return report


def print_text(report: dict[str, Any]) -> None:
    for r in report["results"]:
        body = r["text"] if r["text"] is not None else " ".join(map(str, r["token_ids"]))
        tau = f"{r['tau']:.2f}" if r["tau"] is not None else "-"
        print(f"--- prompt {r['index']} ({r['prompt_len']} tokens) -> {r['new_tokens']} new tokens, "
              f"tau {tau}, {r['tps']:.1f} tokens/s")
        print(body)
    s = report["summary"]
    line = f"=== {report['method']}: {s['new_tokens']} tokens, {s['tps']:.1f} tokens/s"
    if s["tau"] is not None and report["method"] != "ar":
        line += f", tau {s['tau']:.3f}"
    if "lossless" in report:
        line += f", lossless {report['lossless']} (exact {report['lossless_exact']}, tie flips {report['tie_flips']}"
        if report.get("min_margin") is not None:
            line += f", smallest margin {report['min_margin']:.4g}"
        line += ")" + (", exact mode" if report.get("exact") else "")
    print(line)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(argv)
        check_args(args)
        cfg = run_config(args)
        if args.threads:
            torch.set_num_threads(args.threads)
        report = run(args, cfg)
    except ValueError as e:
        if not type(e).__module__.startswith("ready"):  # our input errors only; anything else is a bug
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print_text(report)
    if report.get("lossless") == 0 or (report.get("exact") and report.get("lossless_exact") == 0):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
