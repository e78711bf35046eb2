"""Benchmark the decoding engine: AR tokens/s, verify-vs-step cost, forced-acceptance TPS.

    python -m ready.bench_engine --target tiny --device cpu --json
    python -m ready.bench_engine --target qwen3_5_27b --device cuda --dtype bfloat16 \
        --accept-dist "0:0.1,3:0.3,7:0.6" --accept-dist "0:0.05,3:0.25,7:0.7" --json

Prints one JSON object:
- `ar`: greedy AR through the engine (CUDA graphs on CUDA); `tokens_per_s` follows
  `ready.metrics` (clock from prefill to the last token); `decode_tokens_per_s` and
  `step_ms` leave the prefill out.
- `verify`: the cost of one round's target work, verify of t tokens + commit, for t = 1 (an
  AR step), 2, 4 and K+1, at a fixed context; `ratio` = verify(K+1) / step.
- `forced`: for each `--accept-dist A:p,...`, the engine runs real verify/commit rounds but
  the accepted length of each round is drawn from that distribution instead of compared
  (drafts are random tokens and cost nothing, so this is engine-limited TPS of a drafter
  with that acceptance; the output is of course not lossless). `ideal_speedup` =
  tau * step_ms / verify_ms is what a zero-overhead engine would reach; `engine_efficiency`
  = measured decode speedup / ideal.
- `bound`: weight bytes streamed per step / memory bandwidth (given by --bandwidth; default the
  measured H200 copy rate 4.27e12 B/s on CUDA, none on CPU).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any, Callable, Optional

import torch

from ready.decode.engine import Engine, Generation
from ready.decode.errors import DecodeError
from ready.decode.graphs import GraphRunner


def parse_accept_dist(text: str, block_size: int) -> dict[int, float]:
    """'0:0.1,3:0.3,7:0.6' -> {0: 0.1, 3: 0.3, 7: 0.6} (normalised); A must lie in 0..K."""
    dist: dict[int, float] = {}
    try:
        for part in text.split(","):
            a, p = part.split(":")
            dist[int(a)] = dist.get(int(a), 0.0) + float(p)
    except ValueError:
        raise DecodeError(f"--accept-dist {text!r}: expected 'A:p,A:p,...', e.g. 0:0.1,3:0.3,7:0.6") from None
    bad = [a for a in dist if not 0 <= a <= block_size]
    total = sum(dist.values())
    if bad or total <= 0 or any(p < 0 for p in dist.values()):
        raise DecodeError(f"--accept-dist {text!r}: accepted lengths must lie in 0..K={block_size} with "
                          "non-negative probabilities that sum to more than 0")
    return {a: p / total for a, p in sorted(dist.items())}


class RandomDrafter:
    """Proposes random tokens on the target's device (free drafts for engine-limited timing)."""

    def __init__(self, vocab_size: int, block_size: int, device: torch.device, seed: int = 0) -> None:
        self.vocab_size, self.block_size, self.capture_layers = vocab_size, block_size, []
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def begin(self, prompt_ids: torch.Tensor) -> None:
        pass

    def propose(self, step: Any) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (1, self.block_size), generator=self.gen, device=self.device)


def forced_acceptance(dist: dict[int, float], seed: int = 0) -> Callable[[torch.Tensor, torch.Tensor], int]:
    """An accept_fn that ignores the comparison and draws A from `dist`."""
    rng = random.Random(seed)
    values, weights = list(dist), list(dist.values())
    return lambda drafts, argmax: rng.choices(values, weights)[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_generation(engine: Engine, prompt: torch.Tensor, new_tokens: int, repeats: int) -> list[Generation]:
    engine.generate(prompt, new_tokens)  # warm-up: allocation, graph capture, kernel autotuning
    return [engine.generate(prompt, new_tokens) for _ in range(repeats)]


def _summary(gens: list[Generation]) -> dict[str, float]:
    wall = statistics.median(g.wall_s for g in gens)
    decode = statistics.median(g.wall_s - g.prefill_s for g in gens)
    n = len(gens[0].tokens)
    rounds = [len(g.accepted) for g in gens]
    acc = [a for g in gens for a in g.accepted]
    return {
        "new_tokens": n, "wall_s": wall, "prefill_s": statistics.median(g.prefill_s for g in gens),
        "tokens_per_s": n / wall, "decode_tokens_per_s": (n - 1) / decode if decode > 0 else 0.0,
        "rounds": statistics.median(rounds), "tau": (sum(a + 1 for a in acc) / len(acc)) if acc else None,
    }


def time_verify(target: Any, prompt: torch.Tensor, block_sizes: list[int], iters: int, graphs: bool) -> dict[int, float]:
    """ms per (verify of t tokens + commit(1)) at a context of len(prompt) .. + iters."""
    dev = target.device
    vocab = target.config.vocab_size
    t_max = max(block_sizes)
    cache = target.new_cache(1, prompt.numel() + (iters + 3) * len(block_sizes) + t_max + 1, max_verify=t_max)
    runner = GraphRunner(target, []) if graphs else None
    if runner is not None:
        runner.prepare(cache)
    target.prefill(prompt[None].to(dev), cache)
    out: dict[int, float] = {}
    for t in block_sizes:
        block = torch.randint(0, vocab, (1, t), device=dev)
        verify = (lambda b: runner.verify(b, cache)) if runner is not None else (lambda b: target.verify(b, cache))
        for _ in range(3):  # warm-up (captures the graph)
            verify(block)
            target.commit(cache, 1)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            verify(block)
            target.commit(cache, 1)
        _sync(dev)
        out[t] = (time.perf_counter() - t0) / iters * 1e3
    return out


def bench(target_spec: str, device: str, dtype: str, prompt_len: int, new_tokens: int, block_size: int,
          dists: list[str], repeats: int, verify_iters: int, bandwidth: float, cuda_graphs: Optional[bool],
          compile_layers: bool, seed: int) -> dict[str, Any]:
    from ready.target import load_target

    dists_parsed = [(text, parse_accept_dist(text, block_size)) for text in dists]  # fail before loading
    torch.manual_seed(seed)
    target = load_target(target_spec, device=device, dtype=dtype)
    if compile_layers:
        target.compile_layers()
    dev = target.device
    graphs = dev.type == "cuda" if cuda_graphs is None else cuda_graphs
    vocab = target.config.vocab_size
    if prompt_len + new_tokens > target.config.max_position_embeddings:
        raise DecodeError(f"--prompt-len {prompt_len} + --new-tokens {new_tokens} exceed the target's context of "
                          f"{target.config.max_position_embeddings} tokens")
    prompt = torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(seed))
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    streamed = weight_bytes - target.embed_tokens.weight.numel() * target.embed_tokens.weight.element_size()

    ar = _summary(_median_generation(Engine(target, eos_token_id=-1, cuda_graphs=graphs), prompt, new_tokens, repeats))
    ar["step_ms"] = 1e3 / ar["decode_tokens_per_s"] if ar["decode_tokens_per_s"] else None
    sizes = sorted({1, 2, 4, block_size + 1} - {0})
    ms = time_verify(target, prompt, sizes, verify_iters, graphs)
    verify = {"tokens": sizes, "ms": [ms[t] for t in sizes], "step_ms": ms[1], "verify_ms": ms[block_size + 1],
              "ratio": ms[block_size + 1] / ms[1]}

    forced = []
    for i, (text, dist) in enumerate(dists_parsed):
        engine = Engine(target, RandomDrafter(vocab, block_size, dev, seed + i), eos_token_id=-1, cuda_graphs=graphs,
                        accept_fn=forced_acceptance(dist, seed + i))
        res = _summary(_median_generation(engine, prompt, new_tokens, repeats))
        tau = res["tau"] or 1.0
        ideal = tau * verify["step_ms"] / verify["verify_ms"]
        speed = res["decode_tokens_per_s"] / ar["decode_tokens_per_s"]
        forced.append({
            "accept_dist": dist, "spec": text, "expected_tau": sum(p * (a + 1) for a, p in dist.items()),
            **res, "speedup_vs_ar": res["tokens_per_s"] / ar["tokens_per_s"], "decode_speedup_vs_ar": speed,
            "ideal_speedup": ideal, "engine_efficiency": speed / ideal,
        })

    out: dict[str, Any] = {
        "target": target_spec, "device": str(dev), "dtype": dtype, "cuda_graphs": graphs,
        "compiled_layers": compile_layers, "params": sum(p.numel() for p in target.parameters()),
        "weight_bytes": weight_bytes, "prompt_len": prompt_len, "new_tokens": new_tokens, "block_size": block_size,
        "repeats": repeats, "ar": ar, "verify": verify, "forced": forced, "drafter_cost": "none (random drafts)",
    }
    if bandwidth > 0:
        bound_s = streamed / bandwidth
        out["bound"] = {"bandwidth_bytes_per_s": bandwidth, "streamed_bytes": streamed, "step_ms": bound_s * 1e3,
                        "tokens_per_s": 1.0 / bound_s, "ar_fraction_of_bound": ar["decode_tokens_per_s"] * bound_s}
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ready.bench_engine", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny", help="preset or checkpoint directory (default tiny)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("-k", "--block-size", type=int, default=7)
    ap.add_argument("--accept-dist", action="append", default=None,
                    help="A:p,... distribution of accepted lengths for a forced-acceptance run (repeatable); "
                         "default 0:0.1,3:0.3,7:0.6 when K=7")
    ap.add_argument("--repeats", type=int, default=3, help="timed generations per measurement (median)")
    ap.add_argument("--verify-iters", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s for the bound (default 4.27e12 on CUDA)")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile each target layer first (CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--json", action="store_true", help="compact JSON (default: indented)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    bw = a.bandwidth if a.bandwidth is not None else (4.27e12 if a.device.startswith("cuda") else 0.0)
    dists = a.accept_dist if a.accept_dist is not None else (["0:0.1,3:0.3,7:0.6"] if a.block_size == 7 else [])
    try:
        if a.block_size < 1 or a.new_tokens < 2 or a.prompt_len < 1 or a.repeats < 1:
            raise DecodeError("expected -k >= 1, --new-tokens >= 2, --prompt-len >= 1 and --repeats >= 1")
        with torch.no_grad():
            res = bench(a.target, a.device, dtype, a.prompt_len, a.new_tokens, a.block_size, dists, a.repeats,
                        a.verify_iters, bw, False if a.no_cuda_graphs else None, a.compile, a.seed)
    except ValueError as e:
        if not type(e).__module__.startswith("ready"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
