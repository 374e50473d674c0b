"""SPD's history head: the attention head, also reading the user's history items' states.

A recommendation slate's user context is the items the user chose before; with the prompt's
``history_items`` each is a span of the prompt, read out like a candidate (one state, or one a
token or word). This head compares every candidate with every history item directly and lets
the candidates attend to them, so what the user chose before shapes the scores more than the
backbone's causal attention alone carries it (:class:`HistoryAttentionHead`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spdrank.methods.head_config import HeadConfig
from spdrank.methods.heads import ItemHead, state_projection


class HistoryAttentionHead(ItemHead):
    """The attention head, also reading the states of the user's history items.

    In the paper's head a candidate meets the history only through the backbone's causal
    attention, which a few frozen layers barely use. Here each candidate is compared with each
    history item directly, twice:

    - a match: a similarity of the candidate with each history item, summarised per candidate
      as its largest, its mean and the most recent item's (the shape of a retriever's "closest
      item in the history" score), and added to the candidate's input. On pooled states it is
      the cosine of learned projections; with every token's state (``units``) it is
      token by token, like a late-interaction retriever: each candidate token's best cosine
      with the history item's tokens, averaged with learned per-token weights (a learned
      IDF: which of the title's words identify it);
    - cross-attention: each layer lets the candidates attend to each other and to the history
      items (plus one learned slot, so a slate without history still attends to something).

    Padded history items and token slots are masked everywhere, so the scores do not depend
    on padding.
    """

    #: The layers whose outputs are the scores (zeroed for an anchored model): the attention
    #: stack's map to positions, and the tfidf match's own path to them.
    correction_layers = ("out", "match_positions")

    def __init__(
        self, hidden: int, cfg: HeadConfig, features: int = 0, units: bool = False
    ) -> None:
        """``units``: the prompt's readout keeps several states per item (its tokens or its
        words), and the match compares them unit by unit (as ``cfg.history.match`` says)."""
        if not hidden:
            raise ValueError("the history head compares hidden states: it needs a backbone")
        super().__init__(hidden, cfg.width, features, history=True)
        self.units = units
        self.tfidf = units and cfg.history.match == "tfidf"
        self.match_query = state_projection(
            hidden, cfg.history.match_width if self.tfidf else cfg.width)
        # The tfidf match projects both sides alike (match_query); the others learn a key.
        self.match_key = None if self.tfidf else state_projection(hidden, cfg.width)
        self.token_weight = nn.Linear(hidden, 1) if units else None
        if self.tfidf:
            # Kernel sharpness, learned in log space: identical words meet at cosine 1, others
            # fade as exp(sharpness * (cosine - 1)).
            self.log_sharpness = nn.Parameter(torch.tensor(math.log(10.0)))
            # The match summaries straight to the position scores: a score s_n * g_k with g
            # decreasing in k is already the ranking by s, whatever the layers above add.
            self.match_positions = nn.Linear(3, cfg.positions, bias=False)
            nn.init.zeros_(self.match_positions.weight)
        else:
            self.match_positions = None
        self.match_out = nn.Linear(3, cfg.width)
        self.null = nn.Parameter(torch.zeros(1, 1, cfg.width))
        layer = nn.TransformerDecoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, cfg.layers)
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.positions)

    def match(
        self, h: torch.Tensor, history: torch.Tensor, history_mask: torch.Tensor
    ) -> torch.Tensor:
        """Per candidate [B, N, 3]: its largest, mean and most recent cosine with the history
        (0 for a slate without history)."""
        q, k = self._query_and_key(h, history)
        return _summarise(torch.einsum("bnd,bhd->bnh", q, k), history_mask)

    def _query_and_key(
        self, h: torch.Tensor, history: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidates' match queries and the history items' keys, of unit length."""
        return F.normalize(self.match_query(h), dim=-1), F.normalize(self.match_key(history), dim=-1)

    def match_tokens(
        self,
        h: torch.Tensor,
        item_tokens: torch.Tensor,
        history: torch.Tensor,
        history_tokens: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The match token by token: ``h`` [B, N, W, D] and ``history`` [B, H, W, D] with their
        real token counts; per candidate and history item, the weighted mean over the
        candidate's tokens of each one's best cosine with the item's tokens; summarised [B, N, 3]."""
        q, k = self._query_and_key(h, history)
        sim = torch.einsum("bntd,bhsd->bnths", q, k)
        real_keys = _slots(history_tokens, history.size(2))  # [B, H, W]
        sim = sim.masked_fill(~real_keys[:, None, None], float("-inf")).amax(-1)
        sim = sim.masked_fill(~history_mask[:, None, None], 0.0)  # [B, N, W, H]
        weight = F.softplus(self.token_weight(h).squeeze(-1)) + 1e-6
        weight = weight * _slots(item_tokens, h.size(2))
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1e-6)
        return _summarise(torch.einsum("bnt,bnth->bnh", weight, sim), history_mask)

    def match_tfidf(
        self,
        h: torch.Tensor,
        item_tokens: torch.Tensor,
        history: torch.Tensor,
        history_tokens: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        """A soft TF-IDF cosine: ``h`` [B, N, W, D] and ``history`` [B, H, W, D] with their real
        unit counts; per candidate and history item, sum over pairs of units of w_i v_j k_ij,
        where w and v are learned weights (a learned IDF, unit length over each item's units)
        and k_ij = exp(s (cos_ij - 1)) a kernel that is 1 for the same word and fades for
        others; summarised [B, N, 3]. One projection serves both sides, so a word meets itself
        at cosine 1 from the start."""
        q = F.normalize(self.match_query(h), dim=-1)
        k = F.normalize(self.match_query(history), dim=-1)
        cosine = torch.einsum("bnid,bhjd->bnhij", q, k)
        kernel = torch.exp(self.log_sharpness.exp() * (cosine - 1.0))
        w = _unit_weights(self.token_weight(h).squeeze(-1), item_tokens)
        v = _unit_weights(self.token_weight(history).squeeze(-1), history_tokens)
        sim = torch.einsum("bni,bhj,bnhij->bnh", w, v, kernel)
        return _summarise(sim.masked_fill(~history_mask[:, None], 0.0), history_mask)

    def forward(
        self,
        h: torch.Tensor | None,
        mask: torch.Tensor,
        features: torch.Tensor | None = None,
        history: torch.Tensor | None = None,
        history_mask: torch.Tensor | None = None,
        item_tokens: torch.Tensor | None = None,
        history_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores [B, N, K] from the candidates' states ``h`` [B, N, (W,) D] and ``mask``,
        their ``features``, the history items' states [B, H, (W,) D] and ``history_mask``, and
        with a per-unit readout each item's real unit count (the fields of
        :class:`~spdrank.backbone.readout.HeadInputs`, with the batch's masks and features)."""
        if h is None or history is None or history_mask is None:
            raise ValueError("this head reads the candidates' and the history items' states")
        if self.units:
            if h.dim() != 4 or item_tokens is None or history_tokens is None:
                raise ValueError("this head matches tokens: it reads every token's state "
                                 "(the tokens readout) and their counts")
            match = self.match_tfidf if self.tfidf else self.match_tokens
            stats = match(h, item_tokens, history, history_tokens, history_mask)
            h, history = _slot_means(h, item_tokens), _slot_means(history, history_tokens)
        else:
            stats = self.match(h, history, history_mask)
        items = self.item_inputs(h, features) + self.match_out(stats)
        b = items.size(0)
        memory = torch.cat([self.null.expand(b, -1, -1), self.history_proj(history)], dim=1)
        memory_mask = torch.cat([history_mask.new_ones(b, 1), history_mask], dim=1)
        items = self.decoder(
            items, memory, tgt_key_padding_mask=~mask, memory_key_padding_mask=~memory_mask
        )
        scores = self.out(self.norm(items))
        if self.tfidf:
            scores = scores + self.match_positions(stats)
        return scores.masked_fill(~mask.unsqueeze(-1), 0.0)


def _summarise(sim: torch.Tensor, history_mask: torch.Tensor) -> torch.Tensor:
    """Similarities [B, N, H] with each history item as [B, N, 3]: the largest, the mean and
    the most recent real item's (0 for a slate without history)."""
    real = history_mask.unsqueeze(1)
    count = history_mask.sum(1)
    largest = sim.masked_fill(~real, float("-inf")).amax(-1)
    mean = (sim * real).sum(-1) / count.clamp(min=1).unsqueeze(-1)
    latest = (count - 1).clamp(min=0).view(-1, 1, 1).expand(-1, sim.size(1), 1)
    recent = torch.gather(sim, 2, latest).squeeze(-1)
    stats = torch.stack([largest, mean, recent], dim=-1)
    return stats.masked_fill((count == 0).view(-1, 1, 1), 0.0)


def _slots(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Which of ``width`` token slots are real, for items of ``lengths`` tokens: [..., width]."""
    return torch.arange(width, device=lengths.device) < lengths.unsqueeze(-1)


def _unit_weights(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Positive weights of each item's real units [..., W], of unit length per item, as a
    TF-IDF vector's; padded slots weigh 0."""
    weight = (F.softplus(logits) + 1e-6) * _slots(lengths, logits.size(-1))
    return weight / weight.norm(dim=-1, keepdim=True).clamp(min=1e-6)


def _slot_means(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The mean over each item's real token slots, [..., W, D] -> [..., D], as one matrix
    product per item (which reads the states once)."""
    real = _slots(lengths, states.size(-2)).to(states.dtype)
    weights = real / real.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.matmul(weights.unsqueeze(-2), states).squeeze(-2)
