"""Benchmark the target: prefill tokens/s and decode step time, against the weight-streaming bound.

    python -m benchmarks.target --preset tiny --json target.device=cpu
    python -m benchmarks.target --preset qwen3_5_27b --json

Decode step = verify one token + commit (batch 1), the unit of AR decoding; on CUDA the
forward is replayed from a CUDA graph (GraphedVerify).
The bound is weight bytes / memory bandwidth (a batch-1 decode step must stream every weight).
Prints one JSON object.

The typed config is the command line: the target is `--preset`'s architecture (random weights; or a checkpoint
directory) on the config's `target.device` (auto: CUDA when visible) in its `target.dtype`, the config being
`load_config(--preset, overrides)` (ready/config.py; for a checkpoint directory, the defaults') of every `a.b=v`
argument, parsed and checked as `python -m sweeps.run` does: qwen3_5_27b is bfloat16 on CUDA, tiny and a
checkpoint float32 (the flag's default was bfloat16 on CUDA: say `target.dtype=bfloat16`). The flags that
restated them are gone, each refused in one line naming its override: `--device D` is `target.device=D`,
`--dtype T` `target.dtype=T`. `--compile` (torch.compile each layer's forward first, default off) is this
benchmark's own and not `target.compile` (torch.compile inside the CUDA graphs), which it does not read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional, Sequence

import torch

from benchmarks import copy_rate
from ready.config import ConfigError, entry_point, load_config, replaced_flags
from ready.loading import PipelineConfigError, pick_device
from ready.target import PRESETS, GraphedVerify, load_target

# the flags that restated config keys, and the override that says each now (ready.config.replaced_flags)
REPLACED = {"--device": "target.device", "--dtype": "target.dtype"}


def _timer(device: torch.device):
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    return sync


def _profile_eager(model, cache, tok) -> list[dict]:
    """Top device kernels of one eager decode step (where the time goes)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if tok.is_cuda else [])
    with profile(activities=acts) as prof:
        model.step(tok, cache)
        if tok.is_cuda:
            torch.cuda.synchronize()
    key = "device_time_total" if tok.is_cuda else "cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:15]
    return [{"name": e.key[:80], "us": getattr(e, key), "calls": e.count} for e in rows]


def bench(preset: str, device: str, dtype: str, prompt_len: int, decode_steps: int, bandwidth: float,
          profile: bool = False, compile_layers: bool = False) -> dict:
    dev = torch.device(device)
    torch.manual_seed(0)
    model = load_target(preset, device=dev, dtype=dtype)
    if compile_layers:
        model.compile_layers()
    cfg = model.config
    sync = _timer(dev)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # the embedding table is gathered, not streamed, in a decode step
    streamed = weight_bytes - model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    ids = torch.randint(0, cfg.vocab_size, (1, prompt_len), device=dev)
    cache = model.new_cache(1, prompt_len + decode_steps + 16)

    model.prefill(ids, cache)  # warm-up
    sync()
    cache.reset()
    t0 = time.perf_counter()
    model.prefill(ids, cache)
    sync()
    prefill_s = time.perf_counter() - t0

    tok = ids[:, -1:]
    step = GraphedVerify(model, cache, tokens=1)  # a CUDA graph on GPU, plain verify on CPU

    def decode_step() -> None:
        step(tok)
        model.commit(cache, 1)

    for _ in range(3):  # warm-up steps
        decode_step()
    sync()
    t0 = time.perf_counter()
    for _ in range(decode_steps):
        decode_step()
    sync()
    step_s = (time.perf_counter() - t0) / decode_steps
    top = _profile_eager(model, cache, tok) if profile else None
    out = {
        "preset": preset, "device": str(dev), "dtype": dtype, "compiled_layers": compile_layers,
        "params": sum(p.numel() for p in model.parameters()),
        "weight_bytes": weight_bytes,
        "prefill_tokens": prompt_len, "prefill_tokens_per_s": prompt_len / prefill_s,
        "decode_step_ms": step_s * 1e3, "decode_tokens_per_s": 1.0 / step_s,
    }
    if top is not None:
        out["eager_step_top_kernels"] = top
    if bandwidth > 0:
        bound = streamed / bandwidth
        out.update(bandwidth_bytes_per_s=bandwidth, bound_step_ms=bound * 1e3,
                   bound_tokens_per_s=1.0 / bound, fraction_of_bound=bound / step_s)
    return out


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="overrides of the typed config (ready/config.py), e.g. target.device=cpu target.dtype=bfloat16")
    ap.add_argument("--preset", default="tiny", help="the target: a preset's architecture (random weights), also the "
                    "config's preset, or a checkpoint directory (default tiny)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s for the bound (default: the GPU's measured copy rate, benchmarks.COPY_BYTES_PER_S; "
                         "none on CPU or another GPU)")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--profile", action="store_true", help="add the top kernels of one eager decode step")
    ap.add_argument("--compile", action="store_true", help="torch.compile each layer's forward first (CUDA)")
    replaced_flags(argv, REPLACED)  # a ConfigError: one line, status 2 (entry_point)
    a = ap.parse_intermixed_args(argv)
    cfg = load_config(preset=a.preset if a.preset in PRESETS else None, overrides=a.overrides)
    try:
        device = pick_device(cfg)
    except PipelineConfigError as e:
        raise ConfigError(str(e)) from None
    dtype = str(cfg.target.dtype)
    bw = a.bandwidth if a.bandwidth is not None else copy_rate(device)
    torch.set_grad_enabled(False)
    res = bench(a.preset, device, dtype, a.prompt_len, a.decode_steps, bw, a.profile, a.compile)
    print(json.dumps(res, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
