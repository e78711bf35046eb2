"""HybridLM: the Qwen3.5-style hybrid target with the state interface ReaDy needs.

Training/teacher path: `model(ids, capture_layers, state_layers, state_positions)`.
Inference path over a static `HybridCache`: `prefill`, `verify`, `commit`, `step`,
`committed_states`. See docs/interfaces.md for shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from ready.target.cache import HybridCache
from ready.target.config import EMBEDDINGS, HybridConfig, TargetError
from ready.target.layers import (DecoderLayer, RMSNorm, Rope, commit_gdn, decoder_layer_forward, init_weights,
                                 keeps_verify_states, lin, pass_rope, rope_base)
from ready_kernels import _common


def _inductor_pdl(device: torch.device) -> dict:
    """torch.compile options that make inductor's kernels programmatic dependent launches on
    Hopper (as the small-M linear's are; `ready_kernels._common.pdl_enabled`): inside the graphed
    decode step each small fused kernel then starts while the one before it drains. Empty where
    PDL is off or this torch has no such option."""
    import torch._inductor.config as inductor

    on = _common.pdl_enabled(device) and hasattr(inductor.triton, "enable_pdl")
    return {"triton.enable_pdl": True} if on else {}


@dataclass
class TargetOutput:
    logits: Optional[torch.Tensor]  # [B, T, V] (forward with logits_from=s: [B, T - s, V]; None: not computed)
    hidden: Optional[torch.Tensor] = None  # [B, T, C, D], outputs of the captured layers
    states: Optional[torch.Tensor] = None  # [B, A, Ls, H, d_k, d_v], states after `state_positions`
    normed: Optional[torch.Tensor] = None  # [B, T, D] the final norm's output, the LM head's input (normed=True)


class Backbone(nn.Module):
    """`model.*` in Hugging Face names: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridLM(nn.Module):
    def __init__(self, config: HybridConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        init_weights(self)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._gdn_index = {lid: i for i, lid in enumerate(config.gdn_layer_ids)}
        self._attn_index = {lid: i for i, lid in enumerate(config.attn_layer_ids)}
        self._compiled_fn = None
        self._compiled_exact_fn = None
        self._compiled_rope = None
        self._compiled_exact_rope = None
        # exact mode: verify (and so the AR step, a verify of one token) runs row-invariant ops, so
        # that verify(K+1) and K+1 AR steps give bit-identical logits and states (docs/interfaces.md)
        self.exact: bool = False
        # None = auto: the CUDA-graphed passes (GraphedVerify) run compiled layers on CUDA; True / False
        # force it (compile_layers sets True; `target.compile` in a run's config)
        self.compile_in_graphs: Optional[bool] = None
        # > 0: `prefill` runs a longer prompt in pieces of at most this many tokens, so a long context's
        # activations are those of one piece beside the weights (`benchmarks.engine --prefill-chunk`)
        self.prefill_chunk: int = 0

    def compile_layers(self, enable: bool = True) -> None:
        """torch.compile the per-layer forward (CUDA) for the CUDA-graphed passes: fuses the many
        small elementwise kernels of a decode step, which otherwise dominate a batch-1 step even
        under a CUDA graph. Only the captured passes use it (one compile per block length, during
        the graph's warm-up); prefill and the odd-length last round run eagerly, so no timed
        region ever waits for a recompile."""
        self.compile_in_graphs = enable
        if enable and self._compiled_fn is None:
            import torch._dynamo

            # one compiled variant per (layer type, block length, cache mode): keep them all
            cfg = torch._dynamo.config
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(cfg, name):
                    setattr(cfg, name, max(getattr(cfg, name), 64))
            pdl = _inductor_pdl(self.device)
            self._compiled_fn = torch.compile(decoder_layer_forward, dynamic=False, options=pdl)
            # exact mode's own compiled variant: every cast to a 16-bit dtype rounds as in eager code,
            # wherever inductor fuses it (one fused graph per block length must round like another)
            self._compiled_exact_fn = torch.compile(decoder_layer_forward, dynamic=False,
                                                    options={"emulate_precision_casts": True, **pdl})
            # the pass's rotary inputs in one fused kernel (eager: a dozen tiny ones per pass)
            self._compiled_rope = torch.compile(pass_rope, dynamic=False, options=pdl)
            self._compiled_exact_rope = torch.compile(pass_rope, dynamic=False,
                                                      options={"emulate_precision_casts": True, **pdl})

    def graphs_compile(self) -> bool:
        """Whether graph captures use the compiled layers (see compile_in_graphs); compiles on first use."""
        on = self.compile_in_graphs
        if on is None:
            on = self.device.type == "cuda"
        if on and self._compiled_fn is None:
            self.compile_layers()
            self.compile_in_graphs = None  # still automatic
        return bool(on)

    # --- structure --------------------------------------------------------------------------
    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def final_norm(self) -> RMSNorm:
        return self.model.norm

    @property
    def gdn_layer_ids(self) -> list[int]:
        return self.config.gdn_layer_ids

    @property
    def attn_layer_ids(self) -> list[int]:
        return self.config.attn_layer_ids

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def gdn_index(self, layer_id: int) -> int:
        """Index into the cache's GDN state stack of a GDN model layer id."""
        if layer_id not in self._gdn_index:
            raise TargetError(
                f"layer {layer_id} is not a Gated DeltaNet layer of this target; "
                f"expected one of the GDN layer ids {self.gdn_layer_ids}"
            )
        return self._gdn_index[layer_id]

    def _check_capture(self, capture_layers: Sequence[int]) -> list[int]:
        """Capture ids: a layer's output (0..n-1) or EMBEDDINGS (-1, the token embeddings layer 0 reads)."""
        n = self.config.num_hidden_layers
        bad = [i for i in capture_layers if not EMBEDDINGS <= int(i) < n]
        if bad:
            raise TargetError(f"capture layer ids {bad} out of range; expected ids in 0..{n - 1} "
                              f"(or {EMBEDDINGS} for the token embeddings)")
        return [int(i) for i in capture_layers]

    # --- caches -------------------------------------------------------------------------------
    def new_cache(self, batch_size: int = 1, max_len: int = 2048, max_verify: int = 16) -> HybridCache:
        if max_len > self.config.max_position_embeddings:
            raise TargetError(
                f"max_len {max_len} exceeds the target's context of {self.config.max_position_embeddings} tokens"
            )
        return HybridCache.allocate(self.config, batch_size, max_len, max_verify, self.device, self.dtype,
                                    keeps_verify_states(self.device))

    def committed_states(self, cache: HybridCache, layer_ids: Sequence[int]) -> torch.Tensor:
        """Committed GDN states of `layer_ids`: [len, B, H_v, d_k, d_v] (a view when contiguous ids)."""
        idx = [self.gdn_index(int(i)) for i in layer_ids]
        if idx == list(range(idx[0], idx[0] + len(idx))):
            return cache.ssm[idx[0] : idx[0] + len(idx)]
        return cache.ssm[torch.tensor(idx, device=cache.ssm.device)]

    # --- forward passes -----------------------------------------------------------------------
    def _run(
        self,
        ids: torch.Tensor,
        mode: str,
        cache: Optional[HybridCache],
        capture_layers: Sequence[int] = (),
        state_layers: Sequence[int] = (),
        state_positions: Optional[torch.Tensor] = None,
        compiled: bool = False,
        logits_from: Optional[int] = 0,
        normed: bool = False,
    ) -> TargetOutput:
        """One pass over every layer; `compiled` runs the torch.compile'd layer forward (graph captures).
        A verify pass (the AR step included) of a model in exact mode runs the row-invariant ops."""
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise TargetError(f"input ids must be a non-empty [batch, tokens] tensor; got shape {tuple(ids.shape)}")
        capture = self._check_capture(capture_layers)
        state_set = {self.gdn_index(int(i)): k for k, i in enumerate(state_layers)}
        # a static cache takes positions from cache.length_t (fixed shapes, CUDA graphs)
        start = 0 if cache is None or cache.static else cache.length
        x = self.model.embed_tokens(ids)
        exact = bool(self.exact) and mode == "verify"
        compiled_fn = self._compiled_exact_fn if exact else self._compiled_fn
        layer_fn = compiled_fn if compiled and compiled_fn is not None else decoder_layer_forward
        rope = self._pass_rope(ids.shape[1], start, cache, x, exact, compiled)
        hidden, states = [], [None] * len(state_set)
        if EMBEDDINGS in capture:
            hidden.append((EMBEDDINGS, x))
        for lid, layer in enumerate(self.model.layers):
            gi = self._gdn_index.get(lid, -1)
            pos = state_positions if gi in state_set else None
            slot = None
            if cache is not None:
                slot = cache.gdn_slots[gi] if gi >= 0 else cache.kv_slot(self._attn_index[lid])
            x, at = layer_fn(layer, x, mode, slot, start, pos, exact, rope)
            if gi in state_set:
                states[state_set[gi]] = at
            if lid in capture:
                hidden.append((lid, x))
        h = self.model.norm(x, exact)
        logits = None
        if logits_from is not None:
            hl = h if not logits_from else h[:, int(logits_from):]
            logits = self.head(hl, exact)
        last = len(self.model.layers) - 1  # Hugging Face's hidden_states[n]: the last layer's output, final-normed
        feats = [h if lid == last else t for lid, t in sorted(hidden, key=lambda p: capture.index(p[0]))]
        hid = torch.stack(feats, dim=2) if capture else None
        st = torch.stack(states, dim=2) if state_set else None
        return TargetOutput(logits=logits, hidden=hid, states=st, normed=h if normed else None)

    def _pass_rope(self, T: int, start: int, cache: Optional[HybridCache], x: torch.Tensor, exact: bool,
                   compiled: bool) -> Optional[Rope]:
        """The pass's positions, cos and sin, computed once for all its attention layers (None
        without any); compiled with the layers in graph captures (a static cache's device counter)."""
        if not self._attn_index:
            return None
        attn = self.model.layers[next(iter(self._attn_index))].self_attn
        base = rope_base(start, cache)
        fn = pass_rope
        if compiled and isinstance(base, torch.Tensor) and self._compiled_rope is not None:
            fn = self._compiled_exact_rope if exact else self._compiled_rope
        return fn(base, T, attn.rot_dim, attn.cfg.rope_theta, x.dtype, x.device, exact)

    def head(self, h: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The LM head on final-norm outputs h [..., D] -> logits [..., V]: the one definition, used by every
        pass and by the teacher store (ready.train.teacher_store), which keeps h and runs the head later."""
        return lin(h, self.lm_head.weight, exact) if self.lm_head.bias is None else self.lm_head(h)

    def forward(
        self,
        input_ids: torch.Tensor,
        capture_layers: Sequence[int] = (),
        state_layers: Sequence[int] = (),
        state_positions: Optional[torch.Tensor] = None,
        logits_from: Optional[int] = 0,
        normed: bool = False,
    ) -> TargetOutput:
        """Full-sequence forward without a cache (training / teacher features). `logits_from`: the LM
        head runs on positions logits_from.. only (the teachers of training lie in the response);
        None: no logits (features and states only). `normed`: also return the final norm's output."""
        if state_layers and state_positions is None:
            raise TargetError("state_layers given without state_positions; pass the token positions to read states after")
        if state_positions is not None:
            T = input_ids.shape[1]
            if state_positions.numel() and (state_positions.min() < 0 or state_positions.max() >= T):
                raise TargetError(f"state_positions must lie in 0..{T - 1}")
        if logits_from is not None and not 0 <= int(logits_from) < input_ids.shape[1]:
            raise TargetError(f"logits_from={logits_from}; expected a position in 0..{input_ids.shape[1] - 1} or None")
        return self._run(input_ids, "full", None, capture_layers, state_layers, state_positions,
                         logits_from=logits_from, normed=normed)

    def _check_room(self, cache: HybridCache, n: int) -> None:
        if cache.pending:
            raise TargetError("the cache holds verified tokens that were not committed; call commit(cache, n) first")
        if cache.length + n > cache.max_len:
            raise TargetError(
                f"{cache.length} committed + {n} new tokens exceed the cache's {cache.max_len}-token context"
            )

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, cache: HybridCache, capture_layers: Sequence[int] = (),
                last_logits_only: bool = False) -> TargetOutput:
        """Run a prompt (or any committed continuation) through the target and commit it. `last_logits_only`:
        logits [B, 1, V] of the last position alone; decoding needs no more, and at long prompts the logits
        of every position are the largest tensor of the pass (32k tokens x a 248k vocabulary: 16 GB in bf16).
        With `prefill_chunk` > 0 a longer prompt runs as consecutive continuations of at most that many
        tokens (the same K/V, states and outputs up to rounding; a multiple of 64 keeps the chunked GDN's
        blocks where one pass puts them); each piece's outputs are copied into the whole's as it ends, so
        all-position logits peak at the whole's and one piece's, not twice the whole's."""
        self._check_room(cache, ids.shape[1])
        T, step = ids.shape[1], int(self.prefill_chunk)
        if step < 0:
            raise TargetError(f"prefill_chunk={step}; expected 0 (one pass) or a number of tokens >= 1")
        if cache.ends is not None:
            return self._prefill_padded(ids, cache, capture_layers, last_logits_only)
        pieces = ids.split(step, dim=1) if 0 < step < T else (ids,)
        whole: dict[str, torch.Tensor] = {}  # the pieces' outputs, written in place as they come
        at = 0
        for i, piece in enumerate(pieces):
            n, last = piece.shape[1], i == len(pieces) - 1
            out = self._run(piece, "prefill", cache, capture_layers,
                            logits_from=(n - 1 if last else None) if last_logits_only else 0)
            cache.advance(n)
            if len(pieces) == 1:
                return out
            for name in ("logits", "hidden"):
                part = getattr(out, name)
                if part is None:
                    continue
                one_row = name == "logits" and last_logits_only  # the last piece's last position only
                if name not in whole:
                    whole[name] = part.new_empty(part.shape[0], 1 if one_row else T, *part.shape[2:])
                start = 0 if one_row else at
                whole[name][:, start:start + part.shape[1]] = part
            at += n
        return TargetOutput(logits=whole.get("logits"), hidden=whole.get("hidden"))

    def _prefill_padded(self, ids: torch.Tensor, cache: HybridCache, capture_layers: Sequence[int],
                        last_logits_only: bool) -> TargetOutput:
        """One pass over right-padded prompts ids [B, T] into an empty cache whose `ends` [B] are their lengths
        (`ready.target.ragged.prefill_rows`): with `last_logits_only`, logits [B, 1, V] at each row's own last
        token; the GDN layers keep each row's state after its end."""
        if cache.length or 0 < int(self.prefill_chunk) < ids.shape[1]:
            raise TargetError("a right-padded prefill runs in one pass into an empty cache; got "
                              f"{cache.length} committed tokens and prefill_chunk={self.prefill_chunk}")
        out = self._run(ids, "prefill", cache, capture_layers, logits_from=None if last_logits_only else 0,
                        normed=last_logits_only)
        cache.advance(ids.shape[1])
        if not last_logits_only:
            return out
        last = out.normed[torch.arange(ids.shape[0], device=ids.device), cache.ends - 1]
        return TargetOutput(logits=self.head(last[:, None]), hidden=out.hidden)

    @torch.no_grad()
    def verify(self, block: torch.Tensor, cache: HybridCache, capture_layers: Sequence[int] = ()) -> TargetOutput:
        """Score a block of tokens in one forward; each token's GDN inputs and windows go to cache.pending_*."""
        T = block.shape[1]
        if T > cache.max_verify:
            raise TargetError(f"verify block of {T} tokens exceeds the cache's max_verify={cache.max_verify}")
        self._check_room(cache, T)
        out = self._run(block, "verify", cache, capture_layers)
        cache.pending = T
        return out

    @torch.no_grad()
    def commit(self, cache: HybridCache, n: int) -> None:
        """Keep the first n verified tokens: live state = state after the n-th, KV truncated to match."""
        if not 1 <= n <= cache.pending:
            raise TargetError(f"commit(n={n}) but {cache.pending} tokens are pending; expected 1..{cache.pending}")
        # the GDN states: replayed over the n kept tokens (one launch on CUDA), or the one the verify kept
        commit_gdn(cache.ssm, cache.conv, cache.pending_inputs, cache.pending_conv, n, bool(self.exact),
                   cache.pending_states)
        cache.advance(n)
        cache.pending = 0

    @torch.no_grad()
    def step(self, tok: torch.Tensor, cache: HybridCache, capture_layers: Sequence[int] = ()) -> TargetOutput:
        """One autoregressive step: verify a single token and commit it."""
        out = self.verify(tok, cache, capture_layers)
        self.commit(cache, tok.shape[1])
        return out
