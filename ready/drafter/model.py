"""DSparkDrafter: the DSpark semi-autoregressive block drafter, optionally with ReaDy state readers.

Indexing (DSpark's, identical in training and drafting, docs/interfaces.md "Drafter"): the anchor
`a` is the last committed token. The context is the target's features of tokens[:a]; they are
concatenated over the captured layers, projected by `fc` and normalised, and every draft layer
uses them as extra keys/values. A block is K+1 rows at positions a..a+K (K = `proposals`, DSpark's
block_size = K+1): token a, then K copies of the mask token (the target's embedding of `mask_token_id`);
row j (1..K) predicts token a+j, the K proposals of a round. A Markov head then conditions each proposal on
the previous token; with `drafter.head: none` there is none and the block logits are the LM head's
(a DFlash drafter, saved in DFlash's format). Embeddings and LM head are the target's (frozen, read through `.detach()`,
never part of this module's parameters or state_dict). The reader, when enabled, reads the
committed GDN states after token a-1. Checkpoints: `ready.drafter.checkpoint` (the DSpark format).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from ready.config import ConfigError, DrafterConfig, ReaderConfig, section
from ready.cuda_graph import capture
from ready.drafter.heads import ConfidenceHead, build_head
from ready.drafter.layer_map import map_context_layers, map_inject_layers, map_state_layers
from ready.drafter.layers import BufferedContext, DraftLayer, RMSNorm, Rotary, project, rope_type
from ready.reader import StateReader, StateSource
from ready.target.layers import linear, split_kv_attention

FINGERPRINT_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim",
)


class DrafterError(ValueError):
    """Bad drafter input (config, checkpoint, tensors); the message names it and what was expected."""


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    try:
        return getattr(cfg, name)
    except AttributeError:  # omegaconf's missing-key error is an AttributeError too
        return default


def typed_sections(drafter_cfg: DrafterConfig | DictConfig | Mapping[str, Any],
                   reader_cfg: ReaderConfig | DictConfig | Mapping[str, Any]) -> tuple[DrafterConfig, ReaderConfig]:
    """The drafter's and the reader's config sections as their dataclasses (`ready.config.section`): every key
    typed, every absent key at the dataclass's default, an unknown key one DrafterError naming it."""
    try:
        return (section(DrafterConfig, drafter_cfg, "DSparkDrafter", "drafter"),
                section(ReaderConfig, reader_cfg, "DSparkDrafter", "reader"))
    except ConfigError as e:
        raise DrafterError(str(e)) from None


def _weight_signature(w: torch.Tensor) -> list[list[float]]:
    """A few fixed entries of a weight matrix: cheap even at 27B scale, robust to a bf16 cast."""
    rows = torch.linspace(0, w.shape[0] - 1, 8, device="cpu").long().tolist()  # cpu: also while a meta-device
    cols = torch.linspace(0, w.shape[1] - 1, 16, device="cpu").long().tolist()  # drafter is built (a size check)
    sub = w.detach()[rows][:, cols].float().cpu()
    return sub.tolist()


def target_fingerprint(target: Any) -> dict:
    """What a drafter depends on in its target: architecture fields and the shared embedding/LM head."""
    c = target.config
    return {
        "arch": {k: _get(c, k) for k in FINGERPRINT_FIELDS},
        "embed_tokens": _weight_signature(target.embed_tokens.weight),
        "lm_head": _weight_signature(target.lm_head.weight),
    }


def fingerprint_mismatch(saved: dict, current: dict) -> Optional[str]:
    """None when a drafter built for `saved` fits the target of `current`, else what differs."""
    diffs = [f"{k}={saved['arch'].get(k)!r} (target has {current['arch'].get(k)!r})"
             for k in FINGERPRINT_FIELDS if saved["arch"].get(k) != current["arch"].get(k)]
    if diffs:
        return "architecture " + ", ".join(diffs)
    for name in ("embed_tokens", "lm_head"):
        a, b = torch.tensor(saved[name]), torch.tensor(current[name])
        if not torch.allclose(a, b, rtol=1e-2, atol=1e-3 * float(a.abs().max()) + 1e-8):
            return f"same architecture but different {name} weights (another pretraining or seed)"
    return None


def rotary_max_positions(scaling: Mapping[str, Any], target_max: int) -> int:
    """The drafter's max_position_embeddings from its Hugging Face `rope_scaling`: a yarn-scaled rotary's
    extended range, else the target's."""
    if rope_type(scaling) != "default" and scaling.get("original_max_position_embeddings") and scaling.get("factor"):
        return int(scaling["original_max_position_embeddings"] * scaling["factor"])
    return int(target_max)


class DSparkDrafter(nn.Module):
    """Block drafter over target features; `propose` follows the engine's Drafter protocol."""

    batch_draft = True  # the batched engine drives its draft step for B ragged rows (ready.decode.batch_draft.BatchDraft)

    def __init__(self, drafter_cfg: DrafterConfig | DictConfig | Mapping[str, Any],
                 reader_cfg: ReaderConfig | DictConfig | Mapping[str, Any], target: Any):
        super().__init__()
        c = target.config
        self.drafter_cfg, self.reader_cfg = typed_sections(drafter_cfg, reader_cfg)
        d, r = self.drafter_cfg, self.reader_cfg
        self.proposals = d.proposals  # K: tokens proposed per round (the engine's Drafter protocol)
        self.vocab_size = int(c.vocab_size)
        self.hidden_size = D = int(c.hidden_size)
        self.num_layers = d.num_layers
        if self.proposals < 1 or self.num_layers < 1:
            raise DrafterError(f"drafter.proposals = {self.proposals}, drafter.num_layers = {self.num_layers}; "
                               "expected proposals >= 1 (tokens proposed per round) and num_layers >= 1")
        self.mask_token_id = d.mask_token_id
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DrafterError(f"drafter.mask_token_id = {self.mask_token_id}; expected a token id of the target, "
                               f"0..{self.vocab_size - 1}")
        heads, kv_heads = d.num_attention_heads, d.num_key_value_heads
        if heads < 1 or kv_heads < 1 or heads % kv_heads:
            raise DrafterError(f"drafter.num_attention_heads = {heads}, drafter.num_key_value_heads = {kv_heads}; "
                               "expected positive counts with the KV heads dividing the query heads")
        self.target_num_layers = int(c.num_hidden_layers)
        self.capture_layers = map_context_layers(d.context_layers, self.target_num_layers, space=d.layer_space)
        self.context_window = d.context_window  # 0 = every committed token
        if self.context_window < 0:
            raise DrafterError(f"drafter.context_window = {self.context_window}; expected an integer >= 0 (0 = unlimited)")
        self.head_dim = d.head_dim
        eps = d.rms_norm_eps
        for key, ok, expected in (
                ("head_dim", self.head_dim >= 2 and self.head_dim % 2 == 0, "an even integer >= 2 (the rotary turns pairs)"),
                ("intermediate_size", d.intermediate_size >= 1, "an integer >= 1"),
                ("rms_norm_eps", eps > 0 and math.isfinite(eps), "a finite number > 0"),
                ("rope_theta", d.rope_theta > 0 and math.isfinite(d.rope_theta), "a finite number > 0"),
                ("head_rank", d.head == "none" or d.head_rank >= 1, "an integer >= 1 (or head none)")):
            if not ok:
                raise DrafterError(f"drafter.{key} = {getattr(d, key)!r}; expected {expected}")
        try:
            self.max_position_embeddings = rotary_max_positions(d.rope_scaling, int(c.max_position_embeddings))
            self.rotary = Rotary(self.head_dim, d.rope_theta, d.rope_scaling, self.max_position_embeddings)
        except (KeyError, TypeError, ValueError) as e:
            raise DrafterError(f"drafter.rope_scaling = {d.rope_scaling!r}: {e}; expected Hugging Face "
                               "rope_scaling fields (e.g. rope_type yarn, factor, original_max_position_embeddings)") from None

        self.fc = nn.Linear(len(self.capture_layers) * D, D, bias=False)
        self.hidden_norm = RMSNorm(D, eps)
        self.layers = nn.ModuleList([
            DraftLayer(D, d.intermediate_size, heads, kv_heads, self.head_dim, eps)
            for _ in range(self.num_layers)])
        self.norm = RMSNorm(D, eps)
        self.markov_head = build_head(d.head, self.vocab_size, d.head_rank, D)
        self.confidence_head: Optional[ConfidenceHead] = None
        if d.confidence_head:  # a DFlash drafter (no Markov head) has rank 0: hidden states only
            markov_in = self.markov_head.rank if d.confidence_with_markov else 0
            self.confidence_head = ConfidenceHead(D, markov_in)

        self.reader_enabled = r.enabled
        self.state_layers: list[int] = []
        self.inject_layers: list[int] = []
        self.position = r.position
        self.readers = nn.ModuleDict()
        if self.reader_enabled:
            if self.position not in ("pre", "post"):
                raise DrafterError(f"reader.position = {self.position!r}; expected 'pre' or 'post'")
            self.state_layers = map_state_layers(r.layers, list(c.layer_types), space=r.layer_space)
            self.inject_layers = map_inject_layers(r.inject_layers, self.num_layers)
            for i in self.inject_layers:
                self.readers[str(i)] = StateReader(
                    D, len(self.state_layers), int(c.linear_num_value_heads), int(c.linear_key_head_dim),
                    int(c.linear_value_head_dim), r.rank, r.mlp_hidden, r.eps)
        self._gdn_indices = [target.gdn_index(i) for i in self.state_layers]
        # shared, frozen and unregistered: not moved, saved or trained with the drafter
        object.__setattr__(self, "_shared", (target.embed_tokens, target.lm_head))
        object.__setattr__(self, "_fingerprint", target_fingerprint(target))
        self._ctx: Optional[dict] = None
        self._graphs: list = []

    # --- bookkeeping ------------------------------------------------------------------------
    @property
    def is_dflash(self) -> bool:
        """No Markov head (`drafter.head: none`): a DFlash drafter, whose block logits are the LM head's."""
        return self.markov_head.rank == 0

    def resolved(self) -> dict:
        """The target/draft layer ids this drafter actually uses (for logging)."""
        return {"context_layers": list(self.capture_layers), "state_layers": list(self.state_layers),
                "inject_layers": list(self.inject_layers)}

    def reader_parameters(self) -> list[nn.Parameter]:
        return list(self.readers.parameters())

    def backbone_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if not n.startswith("readers.")]

    # --- pieces -----------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self._shared[0]
        return F.embedding(ids, emb.weight.detach()).to(self.fc.weight.dtype)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head over h [..., D] in the head's dtype, as one 2-D product: a strided h (the draft step's
        h[:, 1:] of B > 1 rows) made F.linear run one product per row, each streaming the whole head (the
        batched draft step was then many times its bound). Not converted to float32 here: the greedy head adds its bias in float32 in the same
        pass as its argmax (`heads.add_argmax`)."""
        head = self._shared[1]
        w = head.weight.detach()
        b = head.bias.detach() if getattr(head, "bias", None) is not None else None
        x = h.to(w.dtype).reshape(-1, h.shape[-1])
        if b is None:  # the small-M linear when drafting on CUDA (F.linear otherwise, and under autograd)
            return linear(x, w).view(*h.shape[:-1], -1)
        return F.linear(x, w, b).view(*h.shape[:-1], -1)

    def _context(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features [B, T, C, D] -> normalised context [B, T, D]."""
        C = len(self.capture_layers)
        if feats.dim() != 4 or feats.shape[2] != C or feats.shape[3] != self.hidden_size:
            raise DrafterError(f"target features have shape {tuple(feats.shape)}; expected [B, T, {C}, "
                               f"{self.hidden_size}] (one slice per capture layer {self.capture_layers})")
        return self.hidden_norm(project(self.fc, feats.flatten(2).to(self.fc.weight.dtype)))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions, self.fc.weight.dtype)

    def _block_input(self, first: torch.Tensor) -> torch.Tensor:
        """Anchor tokens [...] -> block inputs [..., K+1, D]: the embeddings of the anchor and
        of `proposals` mask tokens."""
        masks = torch.full_like(first, self.mask_token_id).unsqueeze(-1).expand(*first.shape, self.proposals)
        return self._embed(torch.cat([first.unsqueeze(-1), masks], dim=-1))

    def confidence(self, hidden: torch.Tensor, prev: torch.Tensor) -> Optional[torch.Tensor]:
        """DSpark's acceptance logits for proposals with hidden states [..., K, D] and previous tokens
        [..., K]; None without a confidence head."""
        if self.confidence_head is None:
            return None
        emb = self.markov_head.markov_w1(prev) if self.confidence_head.with_markov else None
        return self.confidence_head(hidden, emb)

    def block_confidence(self, h: torch.Tensor, first: torch.Tensor, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        """The head's step confidences c_j = sigmoid(logit_j) [B, K] float32 of a drafted block: proposal j
        read with its hidden state h [B, K, D] and the token drafted before it (the anchor `first` [B] for
        j = 1; `tokens` [B, K] the block's drafts), as DeepSpec's evaluator and SGLang's DSpark worker
        score a proposal (`ready.decode.schedule`). c_j depends on drafts 1..j-1 only, never on draft j.
        None without a confidence head. No host sync (graph-safe)."""
        if self.confidence_head is None:
            return None
        prev = torch.cat([first.reshape(-1, 1), tokens[:, :-1]], dim=1)
        return torch.sigmoid(self.confidence(h, prev))

    def _hooks(self, layer: int, read) -> dict:
        if str(layer) not in self.readers:
            return {}
        reader = self.readers[str(layer)]
        return {self.position: lambda h: read(reader, h)}

    def _backbone(self, x: torch.Tensor, cos, sin, context_kv: list, mask, read) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, context_kv[i], mask, **self._hooks(i, read))
        return self.norm(x)

    # --- training ---------------------------------------------------------------------------
    def forward_train(self, tokens: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor,
                      states: Optional[torch.Tensor] = None,
                      confidence: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Draft logits [B, A, K, V] for every anchor; the sequence head is teacher-forced on the labels.

        tokens [B, T]; hidden [B, T, C, D] target features; anchors [B, A] (each block sees context
        positions < anchor); states [B, A, Ls, H, d_k, d_v] committed states after token anchor-1.
        `confidence` (a drafter with a confidence head): also its logits [B, A, K], each position read with
        its hidden state and the label before it (teacher-forced, as DeepSpec trains it) -> (logits, those).
        """
        B, T = tokens.shape
        A, K, D = anchors.shape[1], self.proposals, self.hidden_size
        R = K + 1  # rows of a block: the anchor + K proposals
        dev = tokens.device
        if hidden.shape[:2] != (B, T):
            raise DrafterError(f"hidden has shape {tuple(hidden.shape)}; expected [{B}, {T}, C, D] to match tokens")
        if anchors.dim() != 2 or anchors.shape[0] != B or int(anchors.min()) < 0 or int(anchors.max()) >= T:
            raise DrafterError(f"anchors must be [B={B}, A] token indices in 0..{T - 1}; got shape "
                               f"{tuple(anchors.shape)}")
        read = self._training_reader(states, B, A)
        ctx = self._context(hidden)
        cos_c, sin_c = self._rope(torch.arange(T, device=dev).expand(B, T))
        context_kv = [layer.self_attn.kv(ctx, cos_c, sin_c) for layer in self.layers]

        pos = (anchors.unsqueeze(-1) + torch.arange(R, device=dev)).reshape(B, A * R)
        cos, sin = self._rope(pos)
        first = tokens.gather(1, anchors)  # [B, A]
        x = self._block_input(first).reshape(B, A * R, D)
        t_ids = torch.arange(T, device=dev).view(1, 1, T)
        sees_ctx = t_ids < anchors.unsqueeze(-1)  # [B, A, T]
        if self.context_window:  # only the last W committed tokens (as `draft` slices its context)
            sees_ctx &= t_ids >= anchors.unsqueeze(-1) - self.context_window
        sees_ctx = sees_ctx.repeat_interleave(R, dim=1)  # [B, A*R, T]
        blk = torch.arange(A * R, device=dev) // R
        same_block = (blk.view(-1, 1) == blk.view(1, -1)).expand(B, A * R, A * R)
        mask = torch.cat([sees_ctx, same_block], dim=-1).unsqueeze(1)

        h = self._backbone(x, cos, sin, context_kv, mask, read).view(B, A, R, D)[:, :, 1:]  # the proposals' rows
        base = self._logits(h).float()
        labels = tokens.gather(1, (anchors.unsqueeze(-1) + torch.arange(1, K + 1, device=dev)).clamp(max=T - 1)
                               .view(B, A * K)).view(B, A, K)
        prev = torch.cat([first.unsqueeze(-1), labels[..., :-1]], dim=-1)
        logits = self.markov_head.block_logits(base, prev, h)
        if not confidence:
            return logits
        if self.confidence_head is None:
            raise DrafterError("forward_train(confidence=True) on a drafter without a confidence head; expected "
                               "drafter.confidence_head: true")
        return logits, self.confidence(h, prev)

    def _training_reader(self, states: Optional[torch.Tensor], B: int, A: int):
        if not self.reader_enabled:
            return None
        c = self.readers[str(self.inject_layers[0])]
        H = c.num_pairs // len(self.state_layers)
        want = (B, A, len(self.state_layers), H, c.d_k, c.d_v)
        if states is None or tuple(states.shape) != want:
            got = None if states is None else tuple(states.shape)
            raise DrafterError(f"the reader is enabled, so forward_train needs committed states of shape {want} "
                               f"(state layers {self.state_layers}); got {got}")
        src = StateSource.from_training(states)
        R, D = self.proposals + 1, self.hidden_size  # rows of a block
        return lambda reader, h: reader(h.reshape(B * A, R, D), src).reshape(B, A * R, D)

    # --- drafting ---------------------------------------------------------------------------
    # The context K/V of the committed features lives in static per-layer buffers (`_ctx`), filled
    # incrementally: only rows not projected before are projected. On CUDA the whole draft step
    # (the last K+1 context rows re-projected in place; backbone attention over the
    # committed rows only with the split-key kernel in 16-bit, else over the whole buffer with a length
    # mask; reader, sequence head) is one CUDA graph per target cache (`_DraftGraph`); it is
    # replayed only for the cache it was captured on, so a step that hands another cache (the
    # state placebo's donor) never replays a graph that reads the wrong states. `cuda_graphs`
    # None = on CUDA; True on CPU runs the same static path eagerly (tests).
    cuda_graphs: Optional[bool] = None
    MAX_GRAPHS = 2  # captured graphs kept (the engine's cache and, for the placebo, a donor's)

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """A new sequence: forget the cached context keys/values (the buffers and graphs stay)."""
        if self._ctx is not None:
            self._ctx["n"] = 0
            self._ctx["feats"] = None
        sig = self._weights_signature()
        if sig != getattr(self, "_graph_sig", None):  # new or re-wrapped weights (e.g. LoRA): recapture
            self._graphs = []
            self._graph_sig = sig

    def _weights_signature(self) -> tuple:
        ws = [p for p in self.parameters()] + [m.weight for m in self._shared]
        return tuple((id(w), w.data_ptr(), w.dtype) for w in ws)

    def _ensure_ctx(self, B: int, need: int, dev: torch.device) -> dict:
        """Static per-layer context K/V buffers [B, H_kv, cap, hd] with room for `need` positions
        (grown when needed, which drops the captured graphs that point at the old ones)."""
        dt = self.fc.weight.dtype
        c = self._ctx
        if c is None or c["B"] != B or c["dtype"] != dt or c["cap"] < need or c["k"][0].device != dev:
            cap = max(64, -(-need // 64) * 64)
            shape = (B, self.layers[0].self_attn.num_kv_heads, cap, self.head_dim)
            old = c if (c is not None and c["B"] == B and c["dtype"] == dt) else None
            with torch.inference_mode(False):  # plain tensors: written in place in and out of inference mode
                c = {"B": B, "dtype": dt, "cap": cap, "n": 0, "feats": None,
                     "k": [torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers],
                     "v": [torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers]}
            if old is not None and old["n"]:  # keep what was projected
                for dst, src in zip(c["k"] + c["v"], old["k"] + old["v"]):
                    dst[:, :, : old["n"]] = src[:, :, : old["n"]]
                c["n"], c["feats"] = old["n"], old["feats"]
            self._ctx = c
            self._graphs = []
        return c

    @staticmethod
    def _resume(c: dict, feats: Optional[torch.Tensor], n: int) -> None:
        """Rows projected before stay valid only for the very features buffer they came from (held
        here, so no other tensor can take its address meanwhile) and a row count that only grows."""
        held = c["feats"]
        if held is None or feats is None or held.data_ptr() != feats.data_ptr() or c["n"] > n:
            c["n"] = 0
        c["feats"] = feats

    def _project_rows(self, feats: torch.Tensor, lo: int, hi: int) -> None:
        """Context K/V of feature rows lo..hi-1 into the static buffers."""
        if hi <= lo:
            return
        c = self._ctx
        B = feats.shape[0]
        ctx = self._context(feats[:, lo:hi])
        cos, sin = self._rope(torch.arange(lo, hi, device=feats.device).expand(B, -1))
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, cos, sin)
            c["k"][i][:, :, lo:hi] = k
            c["v"][i][:, :, lo:hi] = v

    def _context_kv(self, feats: Optional[torch.Tensor], B: int, dev: torch.device, room: int = 0) -> list:
        """Per-layer context K/V of all committed features ([B, H_kv, n, hd] views of the static
        buffers), projecting only the rows not seen before. The engine appends to one features
        buffer, so rows already projected are known by that buffer and the count; another tensor
        (or fewer rows) starts over."""
        n = 0 if feats is None else feats.shape[1]
        c = self._ensure_ctx(B, max(n, room), dev)
        self._resume(c, feats, n)
        self._project_rows(feats, c["n"], n)
        c["n"] = max(c["n"], n)
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(c["k"], c["v"])]

    def _cache_source(self, ssm: torch.Tensor, B: int) -> StateSource:
        """Where the readers read in the cache; the index tensors are built once per (cache, batch)."""
        key = (ssm.data_ptr(), ssm.device, B)
        if getattr(self, "_src_key", None) != key:
            self._src, self._src_key = StateSource.from_cache(ssm, self._gdn_indices, B), key
        return StateSource(ssm, self._src.layer_idx, self._src.slots)

    @torch.no_grad()
    def propose(self, step: Any) -> torch.Tensor:
        """Greedy draft of the next K = `proposals` tokens after the last committed one: LongTensor [B, K]."""
        return self.draft(step)[0]

    @torch.no_grad()
    def sample(self, step: Any, sampling: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled draft (temperature > 0, `ready.decode.sampling.DraftSampling`): position j drawn from
        q_j with `sampling.uniforms[:, j]`, the sequence head conditioned on the token drawn at j-1
        -> ([B, K] tokens, [B, K, V] float32 q). The engine's acceptance rule needs q."""
        return self.draft(step, sampling)

    def _finish(self, base: torch.Tensor, first: torch.Tensor, h: torch.Tensor, mode: Optional[tuple],
                uniforms: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The sequence head over the backbone's logits (in the LM head's dtype): greedy (mode None) or
        sampled (mode = (T, top_p), over their float32 values); then the confidence head over the block
        (`block_confidence`; None without one) -> (tokens, logits or q, confidences)."""
        if mode is None:
            toks, x = self.markov_head.greedy(base, first, h)
        else:
            toks, x = self.markov_head.sample(base.float(), first, h, mode[0], mode[1], uniforms)
        return toks, x, self.block_confidence(h, first, toks)

    @torch.no_grad()
    def draft(self, step: Any, sampling: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`propose` with the logits the tokens were drawn from: ([B, K] tokens, [B, K, V] fp32 logits);
        with `sampling` (a DraftSampling) the sampled tokens and their distribution q (see `sample`)."""
        return self.draft_scored(step, sampling)[:2]

    @torch.no_grad()
    def draft_scored(self, step: Any, sampling: Any = None) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """`draft` with the confidence head's step confidences of the drafted block ([B, K] float32 in
        [0, 1], `block_confidence`; None without a confidence head): what confidence-scheduled
        verification reads (`ready.decode.schedule`)."""
        tokens = step.tokens
        B, T = tokens.shape
        dev = tokens.device
        feats = step.features
        if feats is not None and feats.shape[1] != T - 1:
            raise DrafterError(f"DraftStep.features covers {feats.shape[1]} tokens; expected T-1 = {T - 1} "
                               "(features of every committed token but the last)")
        mode = None if sampling is None else (float(sampling.temperature), float(sampling.top_p))
        uniforms = None if sampling is None else sampling.uniforms
        if uniforms is not None and tuple(uniforms.shape) != (B, self.proposals):
            raise DrafterError(f"sampling uniforms of shape {tuple(uniforms.shape)}; expected ({B}, {self.proposals})")
        graphs = dev.type == "cuda" if self.cuda_graphs is None else self.cuda_graphs
        if graphs and feats is not None and T - 1 >= self.proposals + 1:
            return self._draft_static(step, mode, uniforms)
        context_kv = self._context_kv(feats, B, dev)
        if self.context_window:  # the last W context positions, as forward_train masks them
            context_kv = [(k[:, :, -self.context_window:], v[:, :, -self.context_window:]) for k, v in context_kv]
        read = None
        if self.reader_enabled:
            src = self._cache_source(step.cache.ssm, B)
            read = lambda reader, h: reader(h, src)  # noqa: E731
        pos = (T - 1 + torch.arange(self.proposals + 1, device=dev)).expand(B, -1)
        cos, sin = self._rope(pos)
        h = self._backbone(self._block_input(tokens[:, -1]), cos, sin, context_kv, None, read)[:, 1:]
        return self._finish(self._logits(h), tokens[:, -1], h, mode, uniforms)

    # --- the static (CUDA-graph) draft step ----------------------------------------------------
    def _draft_static(self, step: Any, mode: Optional[tuple] = None,
                      uniforms: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The draft step over fixed shapes: rows before the last K+1 are projected eagerly (after
        the prefill), then the graph of `_static_body` is replayed (or run, off CUDA). Sampling
        (`mode` = (T, top_p)) has its own graph, with the uniforms as a static input."""
        tokens, feats, cache = step.tokens, step.features, step.cache
        B, T = tokens.shape
        n, R = T - 1, self.proposals + 1  # a round commits up to K+1 new context rows
        room = max(n + R, int(getattr(cache, "max_len", 0) or 0))
        c = self._ensure_ctx(B, room, tokens.device)
        self._resume(c, feats, n)
        self._project_rows(feats, c["n"], n - R)  # the prefill's rows (the body re-projects the last R)
        g = self._graph_for(cache, B, R, feats, mode)
        if uniforms is not None:
            g.u.copy_(uniforms)
        g.feats.copy_(feats[:, n - R:n])
        g.tok.copy_(tokens[:, -1])
        g.n.fill_(n)
        if g.graph is None and tokens.is_cuda and not g.failed:
            g.capture(self)
        out = self._static_body(g) if g.graph is None else (g.graph.replay() or g.out)
        c["n"] = n
        return out[0].clone(), out[1].clone(), None if out[2] is None else out[2].clone()

    def _graph_for(self, cache: Any, B: int, R: int, feats: torch.Tensor,
                   mode: Optional[tuple] = None) -> "_DraftGraph":
        """The graph bound to this very cache object (and its state tensor) and draft mode, made on first use."""
        for i, g in enumerate(self._graphs):
            if g.cache() is cache and g.ssm_ptr == cache.ssm.data_ptr() and g.B == B and g.mode == mode:
                self._graphs.insert(0, self._graphs.pop(i))  # most recently used first
                return g
        g = _DraftGraph(self, cache, B, R, feats, mode)
        self._graphs = ([g] + self._graphs)[: self.MAX_GRAPHS]  # the least recently used one goes
        return g

    def buffered_context(self, ks: list[torch.Tensor], vs: list[torch.Tensor], n: torch.Tensor) -> list[BufferedContext]:
        """The fixed-shape draft steps' per-layer context: buffers ks/vs [B, H_kv, cap, hd] whose first n rows
        (a device scalar, or [B] per row) are committed, the block after them. The split-key kernel where it
        serves the block (16-bit CUDA), else SDPA over buffer ++ block with keys past the context masked
        (and before the last `context_window` of it, as forward_train masks them)."""
        attn, R = self.layers[0].self_attn, self.proposals + 1  # rows of a block
        B, cap, dev = ks[0].shape[0], ks[0].shape[2], ks[0].device
        split_kv = split_kv_attention(ks[0].dtype, dev, attn.num_heads, attn.num_kv_heads, R)
        mask = rows = None
        if split_kv is not None:  # the block's rows after the context, computed once for every layer
            rows = (n.reshape(-1, 1) + torch.arange(R, device=dev)).clamp(max=cap - 1)
        else:
            at, ends = torch.arange(cap, device=dev), n.reshape(-1, 1)
            sees = at < ends
            if self.context_window:
                sees = sees & (at >= ends - self.context_window)
            block = torch.ones(sees.shape[0], R, dtype=torch.bool, device=dev)
            mask = torch.cat([sees, block], dim=-1)[:, None, None, :].expand(B, 1, R, cap + R)
        return [BufferedContext(k, v, n, self.context_window, mask, split_kv, rows) for k, v in zip(ks, vs)]

    def _static_body(self, g: "_DraftGraph") -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Fixed-shape draft: inputs g.feats (the last R = K+1 context rows), g.tok (anchor), g.n (context
        length); the block has R rows too (the anchor + K proposals)."""
        c, (B, R) = self._ctx, g.feats.shape[:2]
        dev = g.feats.device
        rows = g.n - R + torch.arange(R, device=dev)
        ctx = self._context(g.feats)
        cos, sin = self._rope(rows.expand(B, R))
        for i, layer in enumerate(self.layers):
            layer.self_attn.store_kv(ctx, cos, sin, c["k"][i], c["v"][i], rows[None])
        read = None
        if self.reader_enabled:
            read = lambda reader, h: reader(h, g.src)  # noqa: E731
        cos, sin = self._rope((g.n + torch.arange(R, device=dev)).expand(B, R))
        h = self._backbone(self._block_input(g.tok), cos, sin, self.buffered_context(c["k"], c["v"], g.n), None,
                           read)[:, 1:]
        return self._finish(self._logits(h), g.tok, h, g.mode, g.u)


class _DraftGraph:
    """Static inputs and (on CUDA) the captured graph of one drafter's draft step for one cache.

    It holds a weak reference to the cache and the address of its state tensor: the drafter
    replays it only for that very cache, so the reader never reads states of another cache."""

    def __init__(self, drafter: DSparkDrafter, cache: Any, B: int, R: int, feats: torch.Tensor,
                 mode: Optional[tuple] = None):
        dev = feats.device
        self.cache = weakref.ref(cache)
        self.ssm_ptr = cache.ssm.data_ptr()
        self.B = B
        self.mode = mode  # None: greedy; (temperature, top_p): sampled with the uniforms in `u`
        with torch.inference_mode(False):  # plain tensors: written in place in and out of inference mode
            self.feats = torch.zeros((B, R) + tuple(feats.shape[2:]), device=dev, dtype=feats.dtype)
            self.tok = torch.zeros(B, dtype=torch.long, device=dev)
            self.n = torch.full((), R, dtype=torch.long, device=dev)
            self.u = torch.zeros(B, drafter.proposals, dtype=torch.float32, device=dev)
        self.src = StateSource.from_cache(cache.ssm, drafter._gdn_indices, B) if drafter.reader_enabled else None
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.out: Optional[tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = None
        self.failed = False

    def capture(self, drafter: DSparkDrafter, warmup: int = 2) -> None:
        """Warm up (kernel compilation and tuning) off the capture, then capture `_static_body`.
        The warm-up passes write the same context rows the replay will: nothing else changes."""
        self.graph, self.out = capture(lambda: drafter._static_body(self), warmup, "drafter: the draft step")
        self.failed = self.graph is None
