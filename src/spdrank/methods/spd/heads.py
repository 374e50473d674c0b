"""SPD's heads over the candidates' states: per-candidate hidden states [B, N, D] -> an
item-position score matrix M [B, N, K].

Three ways to look at the items: the linear probe scores each alone, the paper's head lets
every item attend to every other before scoring, and the slot-query head asks, for each rank
position, which item fills it. The history head, which also reads the user's history items'
states, is :mod:`.history`.

No head adds a positional encoding over the items: candidate order is arbitrary (shuffled), so
the heads are permutation-equivariant in the items, and every position column has its own
weights so scores depend on the position (a position-free score would make every permutation
equally good to the decoder). The layers, masks and features they share are
:mod:`spdrank.methods.heads`'.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from spdrank.methods.head_config import HeadConfig
from spdrank.methods.heads import ItemHead, renamed_from


class LinearProbe(ItemHead):
    """Each item scored independently: all cross-item context comes from the backbone."""

    #: The layers whose outputs are the scores (zeroed for an anchored model).
    correction_layers = ("proj.1", "features")

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__(hidden, cfg.positions, features)
        self.register_load_state_dict_pre_hook(
            renamed_from({"norm.": "proj.0.", "out.": "proj.1."})
        )

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.item_inputs(h, features).masked_fill(~mask.unsqueeze(-1), 0.0)


class SelfAttentionHead(ItemHead):
    """The paper's head: L self-attention layers over the items, then a linear map to K scores.

    Each item attends to every other real item, an explicit pairwise comparison before scoring.
    """

    correction_layers = ("out",)

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__(hidden, cfg.width, features)
        layer = nn.TransformerEncoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        # Nested tensors would drop padded rows and change numerics with the padding.
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.positions)

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.item_inputs(h, features)
        x = self.encoder(x, src_key_padding_mask=~mask)
        return self.out(self.norm(x)).masked_fill(~mask.unsqueeze(-1), 0.0)


class SlotQueryHead(ItemHead):
    """The dual view: K learned position queries cross-attend over the items ("what fills rank k?").

    M[i, k] is the scaled dot product of item i's projection with slot k's output.
    """

    correction_layers = ("item_out",)

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__(hidden, cfg.width, features)
        self.slots = nn.Parameter(torch.randn(cfg.positions, cfg.width) * 0.02)
        layer = nn.TransformerDecoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, cfg.layers)
        self.item_out = nn.Linear(cfg.width, cfg.width)
        self.slot_out = nn.Linear(cfg.width, cfg.width)
        self.scale = 1.0 / math.sqrt(cfg.width)

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        items = self.item_inputs(h, features)
        slots = self.slots.unsqueeze(0).expand(items.size(0), -1, -1)
        slots = self.decoder(slots, items, memory_key_padding_mask=~mask)
        scores = torch.einsum("bnd,bkd->bnk", self.item_out(items), self.slot_out(slots))
        return (scores * self.scale).masked_fill(~mask.unsqueeze(-1), 0.0)
