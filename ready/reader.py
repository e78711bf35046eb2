"""The ReaDy state reader: each draft position queries the target's committed GDN states.

For draft position j with representation h_j and every selected (GDN layer, value head) pair m:

    z_j  = W_q RMSNorm(h_j)            rank r per pair
    q_j  = U_m^T z_j                   (d_k)
    T_m  = V_m^T S̄_m                  (r x d_k), shared by the whole block; S̄ = S / rms(S)
    u_jm = T_m q_j / sqrt(d_k)         (r)

f_j = [u_j1 .. u_jM, log rms(S_1) .. log rms(S_M)] goes through a bottleneck MLP to Δh_j and
h'_j = h_j + Δh_j. The MLP's output projection starts at zero, so an untrained reader is the
identity. States use the Hugging Face layout S[d_k, d_v] (S̄_m in the paper = S^T here).

The read is written once, in `ready_kernels.state_reader`: its Triton kernel where `ready.fastops.fused`
says the device runs Triton (it reads the cache in place by GDN index and slot), its torch
reference `state_reader_reference` (the one the kernel is tested against) everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ready import fastops
from ready_kernels import state_reader


class ReaderError(ValueError):
    """A reader setting that does not fit the target; the message says what was expected."""


# the torch path is the kernel's reference itself (this name is how tests read it)
read_states_torch = state_reader.state_reader_reference


def read_states(ssm: torch.Tensor, layer_idx: torch.Tensor, slots: torch.Tensor, z: torch.Tensor,
                U: torch.Tensor, V: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Readouts and log-RMS scales [B, P, M*r + M] in z's dtype (see the module docstring): the fused
    kernel where `fastops.fused(z)`, its torch reference elsewhere (the same numbers,
    tests/test_kernels_state_reader.py).

    ssm [L_gdn, S, H, d_k, d_v]; layer_idx [Ls] GDN indices; slots [B] rows of ssm;
    z [B, P, M, r] with M = Ls*H (pair m = layer m // H, head m % H); U [M, r, d_k]; V [M, d_v, r].
    """
    read = state_reader.state_reader_triton if fastops.fused(z) else state_reader.state_reader_reference
    return read(ssm, layer_idx, slots, z, U, V, eps)


@dataclass
class StateSource:
    """Where the reader finds the committed states: rows `slots` of GDN indices `layer_idx` of `ssm`."""

    ssm: torch.Tensor  # [L_gdn, S, H, d_k, d_v] fp32
    layer_idx: torch.Tensor  # [Ls] long
    slots: torch.Tensor  # [N] long, one per block

    @classmethod
    def from_training(cls, states: torch.Tensor) -> "StateSource":
        """Training states [B, A, Ls, H, d_k, d_v] -> one slot per (sample, anchor) block, in B-major order.

        A strided view, no copy (the fused op and the torch path both take any strides)."""
        B, A, Ls = states.shape[:3]
        ssm = states.flatten(0, 1).transpose(0, 1)
        dev = states.device
        return cls(ssm, torch.arange(Ls, device=dev), torch.arange(B * A, device=dev))

    @classmethod
    def from_cache(cls, ssm: torch.Tensor, gdn_indices: list[int], batch_size: int) -> "StateSource":
        """The target cache itself (no copy): rows 0..batch_size-1 of `cache.ssm` at the given GDN indices."""
        if batch_size > ssm.shape[1]:
            raise ReaderError(f"the cache holds {ssm.shape[1]} sequences but {batch_size} are being drafted; "
                              "expected a cache with one row per sequence")
        dev = ssm.device
        return cls(ssm, torch.tensor(gdn_indices, device=dev, dtype=torch.long), torch.arange(batch_size, device=dev))


def _orthogonal_(t: torch.Tensor) -> None:
    """Each t[m] gets orthonormal rows or columns (full rank, well conditioned)."""
    with torch.no_grad():
        for m in range(t.shape[0]):
            nn.init.orthogonal_(t[m])


class StateReader(nn.Module):
    """Position-conditioned reads of the committed states, added to h as a residual Δh."""

    def __init__(self, hidden: int, num_layers: int, num_heads: int, d_k: int, d_v: int, rank: int,
                 mlp_hidden: int, eps: float = 1e-6):
        super().__init__()
        if not 1 <= rank <= d_k:
            raise ReaderError(f"reader.rank = {rank} does not fit the target's GDN key dimension d_k = {d_k}; "
                              f"expected 1..{d_k} ({d_k} = full rank)")
        if mlp_hidden < 1:
            raise ReaderError(f"reader.mlp_hidden = {mlp_hidden}; expected an integer >= 1")
        self.num_pairs = M = num_layers * num_heads
        self.rank, self.d_k, self.d_v, self.eps = rank, d_k, d_v, eps
        self.norm_weight = nn.Parameter(torch.ones(hidden))  # the reader's own RMSNorm
        self.query = nn.Linear(hidden, M * rank, bias=False)  # W_q
        self.U = nn.Parameter(torch.empty(M, rank, d_k))  # query map into key space
        self.V = nn.Parameter(torch.empty(M, d_v, rank))  # value compression
        _orthogonal_(self.U)
        _orthogonal_(self.V)
        self.fuse_in = nn.Linear(M * rank + M, mlp_hidden)
        self.fuse_out = nn.Linear(mlp_hidden, hidden)
        nn.init.zeros_(self.fuse_out.weight)
        nn.init.zeros_(self.fuse_out.bias)

    def _z(self, h: torch.Tensor) -> torch.Tensor:
        """z = W_q RMSNorm(h) for h [N, P, D] -> [N, P, M, r]."""
        N, P, _ = h.shape
        fast = fastops.drafting_ops() if (fastops.fused(h) and not torch.is_grad_enabled() and type(self.query) is nn.Linear) else None
        if fast is not None:  # drafting on CUDA: one fused norm kernel and the small-M linear, same numbers
            z = fast.linear(fast.rms_norm(h, self.norm_weight, 1e-6, 0.0), self.query.weight)
        else:
            hf = h.float()
            hn = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight.float()).to(h.dtype)
            z = self.query(hn)
        return z.view(N, P, self.num_pairs, self.rank)

    def queries(self, h: torch.Tensor) -> torch.Tensor:
        """The key-space queries q = U_m^T z the reader issues for h [N, P, D] -> [N, P, M, d_k] fp32
        (what `read_states` multiplies the states by; benchmarks.diagnostics.query_span measures them)."""
        return torch.einsum("npmr,mrk->npmk", self._z(h).float(), self.U.float())

    def features(self, h: torch.Tensor, source: StateSource) -> torch.Tensor:
        """f for every position of h [N, P, D] (N = len(source.slots)) -> [N, P, M*r + M] in h's dtype."""
        return read_states(source.ssm, source.layer_idx, source.slots, self._z(h), self.U, self.V, self.eps)

    def delta(self, h: torch.Tensor, source: StateSource) -> torch.Tensor:
        f = self.features(h, source).to(h.dtype)
        return self.fuse_out(F.silu(self.fuse_in(f)))

    def forward(self, h: torch.Tensor, source: StateSource) -> torch.Tensor:
        """h' = h + Δh for h [N, P, D]."""
        return h + self.delta(h, source)
