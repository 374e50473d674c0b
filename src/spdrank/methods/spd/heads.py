"""SPD's heads over the candidates' states: per-candidate hidden states [B, N, D] -> an
item-position score matrix M [B, N, K].

Two ways to look at the items: the linear probe scores each alone, and the paper's head lets
every item attend to every other before scoring. The history head, which also reads the user's
history items' states, is :mod:`.history`.

No head adds a positional encoding over the items: candidate order is arbitrary (shuffled), so
the heads are permutation-equivariant in the items, and every position column has its own
weights so scores depend on the position (a position-free score would make every permutation
equally good to the decoder). The layers, masks and features they share are
:mod:`spdrank.methods.heads`'.
"""

from __future__ import annotations

import torch
from torch import nn

from spdrank.methods.head_config import HeadConfig
from spdrank.methods.heads import ItemHead


class LinearProbe(ItemHead):
    """Each item scored independently: all cross-item context comes from the backbone."""

    #: The layers whose outputs are the scores (zeroed for an anchored model).
    correction_layers = ("proj.1", "features")

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__(hidden, cfg.positions, features)

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
