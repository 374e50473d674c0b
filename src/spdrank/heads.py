"""Scoring heads: per-candidate hidden states [B, N, D] -> item-position scores M [B, N, K].

All heads take a padding mask [B, N] (True = real item) so slates of different N share a
batch. Padded items are excluded from every attention, so a real item's scores do not depend
on how much padding sits next to it. Padded rows of M are set to 0; the Sinkhorn and decoders
mask them anyway.

No head adds a positional encoding over the items: candidate order is arbitrary (shuffled),
so the heads are permutation-equivariant in the items, and every position column has its own
weights so scores depend on the position (a position-free score would make every
permutation equally good to the decoder).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class HeadConfig:
    kind: str = "attn"  # "linear" | "attn" | "slot" (SPD); "scalar" | "first" (peers)
    #: Number of rank positions; must be >= the largest slate.
    positions: int = 64
    #: Width of the head's own layers (attn/slot), projected down from the backbone's D.
    width: int = 256
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        return cls(**data)


class LinearProbe(nn.Module):
    """Each item scored independently: all cross-item context comes from the backbone."""

    matrix = True

    def __init__(self, hidden: int, cfg: HeadConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, cfg.positions)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(h)).masked_fill(~mask.unsqueeze(-1), 0.0)


class SelfAttentionHead(nn.Module):
    """The paper's head: L self-attention layers over the items, then a linear map to K scores.

    Each item attends to every other real item, an explicit pairwise comparison before scoring.
    """

    matrix = True

    def __init__(self, hidden: int, cfg: HeadConfig) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, cfg.width))
        layer = nn.TransformerEncoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        # Nested tensors would drop padded rows and change numerics with the padding.
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.positions)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.proj(h), src_key_padding_mask=~mask)
        return self.out(self.norm(x)).masked_fill(~mask.unsqueeze(-1), 0.0)


class SlotQueryHead(nn.Module):
    """The dual view: K learned position queries cross-attend over the items ("what fills rank k?").

    M[i, k] is the scaled dot product of item i's projection with slot k's output.
    """

    matrix = True

    def __init__(self, hidden: int, cfg: HeadConfig) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, cfg.width))
        self.slots = nn.Parameter(torch.randn(cfg.positions, cfg.width) * 0.02)
        layer = nn.TransformerDecoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, cfg.layers)
        self.item_out = nn.Linear(cfg.width, cfg.width)
        self.slot_out = nn.Linear(cfg.width, cfg.width)
        self.scale = 1.0 / math.sqrt(cfg.width)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        items = self.proj(h)
        slots = self.slots.unsqueeze(0).expand(h.size(0), -1, -1)
        slots = self.decoder(slots, items, memory_key_padding_mask=~mask)
        scores = torch.einsum("bnd,bkd->bnk", self.item_out(items), self.slot_out(slots))
        return (scores * self.scale).masked_fill(~mask.unsqueeze(-1), 0.0)


class ScalarHead(nn.Module):
    """The classic pointwise peer: one score per item, ranked by sorting (no positions).

    Returns [B, N] (padded items 0). Trained with a listwise loss (ListNet), decoded by argsort.
    """

    matrix = False

    def __init__(self, hidden: int, cfg: HeadConfig) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.LayerNorm(hidden), nn.Linear(hidden, cfg.width), nn.GELU(), nn.Linear(cfg.width, 1)
        )

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.mlp(h).squeeze(-1).masked_fill(~mask, 0.0)


class FirstHead(nn.Module):
    """FIRST (Reddy et al. 2024): the LM's first-token logits over the candidates' identifiers.

    The prompt ends with "[" and each candidate is labelled by one token (a letter), so the
    logit of that token at the last position scores the candidate. The backbone's LM head does
    the work; this module only holds the identifier token ids. Returns [B, N].
    """

    matrix = False

    def __init__(self, token_ids: list[int]) -> None:
        super().__init__()
        self.register_buffer("token_ids", torch.tensor(token_ids, dtype=torch.long))

    def forward(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return logits[:, self.token_ids[: mask.size(1)]].masked_fill(~mask, 0.0)


HEADS: dict[str, type[nn.Module]] = {
    "linear": LinearProbe,
    "attn": SelfAttentionHead,
    "slot": SlotQueryHead,
    "scalar": ScalarHead,
}


def build_head(hidden: int, cfg: HeadConfig) -> nn.Module:
    try:
        cls = HEADS[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown head {cfg.kind!r}: choose one of {sorted(HEADS)}") from None
    return cls(hidden, cfg)
