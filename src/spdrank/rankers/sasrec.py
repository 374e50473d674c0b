"""SASRec (Kang & McAuley, 2018): self-attentive next-item prediction, written in torch.

Why by hand: neither well-kept library installs beside the project's pins. Every rectools
release asks for numpy<2 on Python < 3.12 (pip would downgrade numpy 2.4.6 to 1.26.4), and
RecBole 1.2.1, its latest release, aliases ``np.float_`` when it builds a config (removed in
numpy 2), loads its checkpoints with ``torch.load``'s old pickle default, and pulls in ray,
tensorboard and plotly. docs/sasrec.md has the evidence. The model is small:

- item embeddings (row 0 is padding) scaled by sqrt(dim), plus learned positions counted from
  the end of the sequence, so the last item always sits at the same position whatever the
  batch's padding;
- ``blocks`` causal self-attention blocks (pre-norm attention, a point-wise feed-forward
  layer, residuals, dropout), then a layer norm;
- at every position the hidden state scores the next item by a dot product with its
  embedding; training is the cross-entropy of a softmax over the catalogue (``loss="ce"``,
  the default, as RecBole trains it), or the paper's binary cross-entropy of the true next
  item against one negative sampled uniformly from the items the user never interacted with
  (``loss="bce"``).

Padding never moves a real position: padded keys are masked (a padded query attends to
itself only, so no row is empty), so a history's scores do not depend on what it is batched
with.

A fitted model is cached by its inputs (:func:`cache_key`: the sequences in order, the
vocabulary and every setting), as ``sasrec.json`` (settings, vocabulary, fit statistics) and
``model.safetensors``: loading one never runs code, and the same inputs never train twice.
A build that fits one (the ``sasrec`` feature or retriever) records its key in its manifest,
and ``spdrank eval --ranker sasrec`` on that build's training file loads that fit
(:meth:`SASRecRanker.fit_build`) rather than fitting its own. Fitting is seeded (weights,
dropout, batch order, negatives), leaves torch's global random state as it was, and logs one
line an epoch with the total and the time left: a fit takes minutes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, training_sequence
from spdrank.rankers.sasrec_config import SAMPLED_NEGATIVES, SASREC, SASREC_FIT, SASRecConfig

log = logging.getLogger(__name__)

#: Bumped when the training code or the file layout changes, so old caches are not reused.
FORMAT = 1
CONFIG_FILE = "sasrec.json"
WEIGHTS_FILE = "model.safetensors"
#: Users whose sequences are sorted by length together, so batches need little padding.
_BUCKET_BATCHES = 32
#: Histories encoded per forward pass at inference.
_ENCODE_BATCH = 512
#: Positions (histories x their padded length) of an inference forward per intra-op thread.
#: SASRec's matrices are [positions, 64]: a forward of one slate's history is a few dozen
#: products of microseconds each, about what a thread pool's fork and join cost, and a worker
#: descheduled by another process on a shared core stalls every product for a scheduler slice
#: (milliseconds). A thread pays for itself only when its share is work of that order: about
#: this many positions, some tens of milliseconds of one core's work.
POSITIONS_PER_THREAD = 2048


def forward_threads(positions: int, available: int | None = None) -> int:
    """How many of the ``available`` intra-op threads (default: torch's setting) a forward over
    ``positions`` positions uses: one per :data:`POSITIONS_PER_THREAD`, at least one."""
    available = torch.get_num_threads() if available is None else available
    return max(1, min(available, positions // POSITIONS_PER_THREAD))


@contextmanager
def threads_for(positions: int) -> Iterator[int]:
    """torch's intra-op thread count sized for a forward over ``positions`` positions
    (:func:`forward_threads`) inside the block, the caller's count restored after it.

    The setting is process-wide, as torch keeps it; spdrank ranks with one ranker at a time in
    a process, so nothing else runs a forward while the block holds it.
    """
    before = torch.get_num_threads()
    threads = forward_threads(positions, before)
    if threads == before:
        yield threads
        return
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def default_cache_dir() -> Path:
    """``sasrec/`` under spdrank's cache ($SPDRANK_CACHE, else $XDG_CACHE_HOME/spdrank)."""
    from spdrank.backbone.locate import cache_dir

    return cache_dir() / SASREC


def cache_key(
    sequences: Sequence[Sequence[str]], items: Sequence[str], config: SASRecConfig
) -> str:
    """sha256 of everything a fit depends on: format, settings, vocabulary, sequences in order."""
    digest = hashlib.sha256()
    header = {"format": FORMAT, "config": config.to_dict(), "items": list(items)}
    digest.update(json.dumps(header, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    for seq in sequences:
        digest.update(b"\n" + json.dumps(list(seq), ensure_ascii=False).encode("utf-8"))
    return digest.hexdigest()


class _Block(nn.Module):
    """Pre-norm causal self-attention and a point-wise feed-forward layer, with residuals."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.attn_norm = nn.LayerNorm(dim, eps=1e-8)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-8)
        self.ffn = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, D]; ``allowed`` [B, 1, T, T] (True: the query may attend to the key)."""
        b, t, d = x.shape
        query = self.attn_norm(x)
        q = self.q(query)
        k, v = self.kv(x).chunk(2, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
        )
        x = query + self.out(attn.transpose(1, 2).reshape(b, t, d))
        x = self.ffn_norm(x)
        return x + self.ffn(x)


class SASRecModel(nn.Module):
    """The network: item ids [B, T] (0 = padding, left-padded) -> hidden states [B, T, D]."""

    def __init__(self, n_items: int, config: SASRecConfig) -> None:
        super().__init__()
        self.config = config
        self.items = nn.Embedding(n_items + 1, config.dim, padding_idx=0)
        self.positions = nn.Embedding(config.max_len, config.dim)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            _Block(config.dim, config.heads, config.dropout) for _ in range(config.blocks)
        )
        self.norm = nn.LayerNorm(config.dim, eps=1e-8)
        # Xavier-normal matrices (as the authors' code): N(0, 1) embeddings scaled by
        # sqrt(dim) would start with logits in the hundreds.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_normal_(p)
        with torch.no_grad():
            self.items.weight[0].zero_()

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        t = seq.shape[1]
        keep = (seq != 0).unsqueeze(-1)
        where = torch.arange(self.config.max_len - t, self.config.max_len, device=seq.device)
        x = self.items(seq) * math.sqrt(self.config.dim) + self.positions(where)
        x = self.dropout(x) * keep
        causal = torch.ones(t, t, dtype=torch.bool, device=seq.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=seq.device)
        allowed = (causal & (keep.transpose(1, 2) | eye)).unsqueeze(1)  # [B, 1, T, T]
        for block in self.blocks:
            x = block(x, allowed) * keep
        return self.norm(x)


@dataclass
class FitStats:
    """What a fit did, saved beside the weights."""

    seconds: float = 0.0
    threads: int = 1
    sequences: int = 0
    #: Mean training loss of each epoch.
    losses: list[float] = field(default_factory=list)


class SASRec:
    """A fitted SASRec over a vocabulary of item ids: scores, and top-n retrieval."""

    def __init__(
        self, items: Sequence[str], config: SASRecConfig, model: SASRecModel | None = None,
        key: str = "", stats: FitStats | None = None,
    ) -> None:
        self.items = list(items)
        self.index = {item: i for i, item in enumerate(self.items, start=1)}
        if len(self.index) != len(self.items):
            raise ValueError("SASRec vocabulary repeats an item id")
        self.config = config
        if model is None:
            with torch.random.fork_rng(devices=[]):  # seeded, and the caller's state kept
                torch.manual_seed(config.seed)
                model = SASRecModel(len(self.items), config)
        self.model = model
        self.key = key
        self.stats = stats or FitStats()
        self._vectors: np.ndarray | None = None

    # -- fitting ----------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        sequences: Iterable[Sequence[str]],
        config: SASRecConfig | None = None,
        items: Iterable[str] | None = None,
        cache: str | os.PathLike[str] | None = None,
    ) -> SASRec:
        """A model fitted on ``sequences`` (item ids, oldest first), or the cached one.

        ``items``: the vocabulary, the items the model can score and retrieve (default: those
        of the sequences); items of the sequences outside it are dropped. An item of the
        vocabulary that no sequence holds is only ever a sampled negative. ``cache``: a
        directory holding fitted models by :func:`cache_key` (None: no cache).
        """
        config = config or SASRecConfig()
        seqs = [list(s) for s in sequences]
        vocab = sorted(set(items) if items is not None else {i for s in seqs for i in s})
        if not vocab:
            raise ValueError("SASRec needs at least one item to fit on: the sequences are empty")
        key = cache_key(seqs, vocab, config)
        where = Path(cache) / key[:32] if cache is not None else None
        cached = cls.cached(key, cache)
        if cached is not None:
            return cached
        model = cls(vocab, config, key=key)
        model._train(seqs)
        if where is not None:
            model.save(where)
            log.info("SASRec: cached the fit in %s", where)
        return model

    @classmethod
    def cached(cls, key: str, cache: str | os.PathLike[str] | None) -> SASRec | None:
        """The fit of :func:`cache_key` ``key`` from ``cache``, or None when it holds none."""
        if cache is None:
            return None
        where = Path(cache) / key[:32]
        if not (where / CONFIG_FILE).is_file():
            return None
        model = cls.load(where)
        if model.key != key:
            return None
        log.info("SASRec: loaded the cached fit %s (no fitting)", where)
        return model

    def _train(self, sequences: list[list[str]]) -> None:
        cfg = self.config
        users = [self._ids(s) for s in sequences]
        users = [u for u in users if len(u) >= 2]  # one item predicts nothing
        if not users:
            raise ValueError("SASRec needs a sequence of at least 2 known items to fit on")
        log.info(
            "SASRec: fitting on %s sequences over %s items, %d epochs of %d batches "
            "(cached by its inputs once done)",
            f"{len(users):,}", f"{len(self.items):,}", cfg.epochs,
            -(-len(users) // cfg.batch_size),
        )
        t0 = time.perf_counter()
        rng = random.Random(cfg.seed)
        gen = torch.Generator().manual_seed(cfg.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.model = SASRecModel(len(self.items), cfg)
            self.model.train()
            opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
            losses: list[float] = []
            for epoch in range(cfg.epochs):
                total, count = 0.0, 0
                for batch in self._batches(users, rng):
                    loss = self._step(batch, gen, opt)
                    total += loss * len(batch)
                    count += len(batch)
                losses.append(total / count)
                elapsed = time.perf_counter() - t0
                left = elapsed / (epoch + 1) * (cfg.epochs - epoch - 1)
                log.info("SASRec epoch %d/%d: loss %.4f, %.0f s, about %.0f s left",
                         epoch + 1, cfg.epochs, losses[-1], elapsed, left)
        self.model.eval()
        self._vectors = None
        self.stats = FitStats(
            seconds=time.perf_counter() - t0, threads=torch.get_num_threads(),
            sequences=len(users), losses=losses,
        )

    def _batches(self, users: list[list[int]], rng: random.Random) -> list[list[list[int]]]:
        """One epoch's batches: shuffled, sorted by length within buckets, then shuffled."""
        order = list(range(len(users)))
        rng.shuffle(order)
        size = self.config.batch_size
        bucket = size * _BUCKET_BATCHES
        batches = []
        for start in range(0, len(order), bucket):
            chunk = sorted(order[start : start + bucket], key=lambda i: len(users[i]))
            batches.extend(
                [users[i] for i in chunk[j : j + size]] for j in range(0, len(chunk), size)
            )
        rng.shuffle(batches)
        return batches

    def _step(
        self, batch: list[list[int]], gen: torch.Generator, opt: torch.optim.Optimizer
    ) -> float:
        window = [u[-(self.config.max_len + 1) :] for u in batch]
        inputs = _left_pad([w[:-1] for w in window])
        positives = _left_pad([w[1:] for w in window])
        hidden = self.model(inputs)
        real = positives != 0
        if self.config.loss == "ce":
            loss = self._softmax_loss(hidden[real], positives[real], gen)
        else:
            own = _left_pad(batch)  # every item of the user, never a negative
            negatives = self._negatives(positives.shape, own, gen)
            pos = (hidden * self.model.items(positives)).sum(-1)[real]
            neg = (hidden * self.model.items(negatives)).sum(-1)[real]
            loss = F.binary_cross_entropy_with_logits(
                pos, torch.ones_like(pos)
            ) + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())

    def _softmax_loss(
        self, hidden: torch.Tensor, targets: torch.Tensor, gen: torch.Generator
    ) -> torch.Tensor:
        """Cross-entropy of each position's next item (``hidden`` [P, D], ``targets`` [P] ids)
        under a softmax over every item, or, for a catalogue beyond
        :data:`SAMPLED_NEGATIVES`, over the next item and that many uniform draws shared by
        the batch (a draw that is the position's own next item left out)."""
        table = self.model.items.weight
        n = len(self.items)
        if n <= SAMPLED_NEGATIVES:
            return F.cross_entropy(hidden @ table[1:].T, targets - 1)
        drawn = torch.randint(1, n + 1, (SAMPLED_NEGATIVES,), generator=gen)
        positive = (hidden * table[targets]).sum(-1, keepdim=True)
        negative = (hidden @ table[drawn].T).masked_fill(
            drawn.unsqueeze(0) == targets.unsqueeze(1), float("-inf"))
        logits = torch.cat([positive, negative], dim=1)
        return F.cross_entropy(logits, torch.zeros_like(targets))

    def _negatives(
        self, shape: torch.Size, own: torch.Tensor, gen: torch.Generator
    ) -> torch.Tensor:
        """Uniform item ids, each redrawn while it is one of its user's own items (at most
        100 times, so a user holding nearly every item cannot stall the fit)."""
        n = len(self.items)
        neg = torch.randint(1, n + 1, shape, generator=gen)
        for _ in range(100):
            clash = (neg.unsqueeze(-1) == own.unsqueeze(1)).any(-1)
            if not clash.any():
                break
            neg[clash] = torch.randint(1, n + 1, (int(clash.sum()),), generator=gen)
        return neg

    # -- saving -----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``sasrec.json`` and ``model.safetensors`` into ``path`` (atomically, whole)."""
        from safetensors.torch import save_file

        from spdrank.core.atomic_dir import atomic_directory

        meta: dict[str, Any] = {
            "format": FORMAT,
            "key": self.key,
            "config": self.config.to_dict(),
            "fit": {
                "seconds": round(self.stats.seconds, 3),
                "threads": self.stats.threads,
                "sequences": self.stats.sequences,
                "losses": [round(x, 6) for x in self.stats.losses],
            },
            "items": self.items,
        }
        with atomic_directory(path) as tmp:
            state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
            save_file(state, str(tmp / WEIGHTS_FILE))
            (tmp / CONFIG_FILE).write_text(
                json.dumps(meta, ensure_ascii=False) + "\n", encoding="utf-8"
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SASRec:
        """A model written by :meth:`save`; errors name the directory and what is wrong."""
        from safetensors.torch import load_file

        path = Path(path)
        try:
            meta = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path / CONFIG_FILE}: not a saved SASRec ({exc})") from None
        if meta.get("format") != FORMAT:
            raise ValueError(
                f"{path / CONFIG_FILE}: SASRec format {meta.get('format')!r}, this code reads "
                f"{FORMAT}; delete the directory to refit"
            )
        config = SASRecConfig.from_dict(meta["config"])
        fit = meta.get("fit", {})
        model = cls(
            meta["items"], config, key=meta.get("key", ""),
            stats=FitStats(fit.get("seconds", 0.0), fit.get("threads", 1),
                           fit.get("sequences", 0), fit.get("losses", [])),
        )
        weights = path / WEIGHTS_FILE
        if not weights.is_file():
            raise ValueError(f"{path}: no {WEIGHTS_FILE} beside {CONFIG_FILE}")
        model.model.load_state_dict(load_file(str(weights)))
        model.model.eval()
        return model

    # -- scoring ----------------------------------------------------------------------------

    def _ids(self, items: Iterable[str]) -> list[int]:
        """Vocabulary rows of ``items``, unknown ones dropped."""
        return [i for i in (self.index.get(x) for x in items) if i is not None]

    @property
    def item_vectors(self) -> np.ndarray:
        """The item embeddings [n_items + 1, dim] (row 0: padding, zeros), as float64 numpy:
        every score is a float64 product of the same numbers, whichever method computes it."""
        if self._vectors is None:
            self._vectors = self.model.items.weight.detach().numpy().astype(np.float64)
        return self._vectors

    def encode(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """The state after each history's last item [n, dim]: what scores the next item.

        History items outside the vocabulary are dropped and only the last ``max_len`` kept;
        an empty history is all padding (its scores then depend on the candidate alone).
        The histories go through the network together, sorted by length so each forward pads
        little, up to ``_ENCODE_BATCH`` a forward, each forward on the threads its size pays
        for (:func:`threads_for`); padding moves no state, so a history's state is the one it
        gets alone.
        """
        self.model.eval()
        out = np.zeros((len(histories), self.config.dim), dtype=np.float32)
        ids = [self._ids(h)[-self.config.max_len :] or [0] for h in histories]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        with torch.inference_mode():
            for start in range(0, len(order), _ENCODE_BATCH):
                rows = order[start : start + _ENCODE_BATCH]
                batch = _left_pad([ids[i] for i in rows])
                with threads_for(batch.numel()):
                    hidden = self.model(batch)[:, -1]
                out[rows] = hidden.numpy()
        return out

    def known(self, item: str) -> bool:
        return item in self.index

    def scores_from(self, state: np.ndarray, candidates: Sequence[str]) -> list[float | None]:
        """Each candidate's score given an :meth:`encode` state; None for an unknown item."""
        rows = [self.index.get(c) for c in candidates]
        vecs = self.item_vectors[[r or 0 for r in rows]]
        values = (vecs @ state.astype(np.float64)).tolist()
        return [v if r is not None else None for v, r in zip(values, rows)]

    def score(self, history: Sequence[str], candidates: Sequence[str]) -> list[float]:
        """Each candidate's score after ``history`` (a logit: higher is likelier next).

        A candidate outside the vocabulary has no embedding; it scores one below the lowest
        known candidate (0.0 when none is known), so it ranks last rather than by chance.
        """
        return self.score_many([history], [candidates])[0]

    def score_many(
        self, histories: Sequence[Sequence[str]], candidates: Sequence[Sequence[str]]
    ) -> list[list[float]]:
        """:meth:`score` of many slates (a history and its candidates each), the histories
        encoded together (:meth:`encode`): one forward for up to ``_ENCODE_BATCH`` slates."""
        if len(histories) != len(candidates):
            raise ValueError(
                f"score_many: {len(candidates)} candidate lists for {len(histories)} histories"
            )
        states = self.encode(histories)
        out: list[list[float]] = []
        for state, docids in zip(states, candidates):
            values = self.scores_from(state, docids)
            known = [v for v in values if v is not None]
            floor = (min(known) - 1.0) if known else 0.0
            out.append([floor if v is None else v for v in values])
        return out

    def top_n(
        self, history: Sequence[str], n: int, exclude: Iterable[str] | None = None
    ) -> list[tuple[str, float]]:
        """The ``n`` best-scored items after ``history``, best first, with their scores.

        ``exclude``: items never returned (default: the history itself).
        """
        return self.top_n_many([history], n, [exclude] if exclude is not None else None)[0]

    def top_n_many(
        self,
        histories: Sequence[Sequence[str]],
        n: int,
        exclude: Sequence[Iterable[str]] | None = None,
    ) -> list[list[tuple[str, float]]]:
        """:meth:`top_n` of many histories, encoded in batches; ties go to the earlier id."""
        return self.top_n_from(
            self.encode(histories), n, exclude if exclude is not None else histories
        )

    def top_n_from(
        self, states: np.ndarray, n: int, exclude: Sequence[Iterable[str]]
    ) -> list[list[tuple[str, float]]]:
        """:meth:`top_n` of :meth:`encode` states, each with its own items to exclude."""
        if n < 1:
            raise ValueError(f"top_n needs n >= 1, got {n}")
        if len(exclude) != len(states):
            raise ValueError(f"top_n: {len(exclude)} exclusion lists for {len(states)} states")
        vectors = self.item_vectors.T
        out: list[list[tuple[str, float]]] = []
        for start in range(0, len(states), _ENCODE_BATCH):
            block = states[start : start + _ENCODE_BATCH].astype(np.float64) @ vectors
            for j, row in enumerate(block):
                skip = exclude[start + j]
                row[0] = -np.inf
                row[self._ids(skip)] = -np.inf
                k = min(n, int(np.isfinite(row).sum()))
                if k == 0:
                    out.append([])
                    continue
                top = np.argpartition(-row, k - 1)[:k]
                top = sorted(top.tolist(), key=lambda r: (-row[r], r))
                out.append([(self.items[r - 1], float(row[r])) for r in top])
        return out


def _left_pad(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Rows of item ids, left-padded with 0 to the longest (at least 1)."""
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
    return out


class SASRecRanker:
    """``spdrank eval --ranker sasrec``: SASRec fitted on the training slates, like the
    co-occurrence baseline: each slate's history then its clicked items, in file order
    (:func:`spdrank.core.slates.training_sequence`), then the sequences of users who make no
    slate when the build wrote them (:meth:`fit_sequences`).

    Only the training file feeds the fit, so no evaluation target is ever seen (the fit a
    build made, which :meth:`fit_build` loads instead, holds no slate's target at all). The
    vocabulary is every item those slates show (candidates too: an item that is only ever a
    negative is still an id the model can rank low); an evaluation candidate outside it
    ranks last (:meth:`SASRec.score`). The fit is cached by its inputs, so a second
    evaluation against the same training file loads it.
    """

    needs_train = True
    #: It learns from users' interaction histories: a search slate (no history) has none.
    needs_history = True
    ranks_by_scores = True

    def __init__(
        self,
        config: SASRecConfig | None = None,
        cache: str | os.PathLike[str] | None = "default",
        name: str = SASREC,
    ) -> None:
        self.config = config or SASRecConfig()
        self.cache = default_cache_dir() if cache == "default" else cache
        self.name = name
        self.model: SASRec | None = None
        #: The training file whose build's fit :attr:`model` is (:meth:`fit_build`), if it is.
        self.build: Path | None = None

    def fit(self, train: Iterable[Slate]) -> None:
        sequences: list[list[str]] = []
        items: set[str] = set()
        for slate in train:
            seq = training_sequence(slate)
            sequences.append(seq)
            items.update(seq)
            items.update(slate.docids)
        self._fit(sequences, items)

    def fit_sequences(self, sequences: Iterable[Sequence[str]]) -> None:
        """Fit on interaction sequences alone: ``spdrank eval`` passes the training slates'
        (:func:`spdrank.core.slates.training_sequence`) followed by those of the users who make
        no slate (``extra_sequences.txt``), as it does to the count baselines, so SASRec
        learns from every interaction they count.

        Without the slates their candidates are unknown, so the vocabulary is the items of the
        sequences; a candidate no one interacted with ranks last, as one outside the
        vocabulary always does, rather than low by its trained-as-negative embedding.
        """
        seqs = [list(s) for s in sequences]
        self._fit(seqs, {item for seq in seqs for item in seq})

    def _fit(self, sequences: list[list[str]], items: set[str]) -> None:
        if not sequences:
            raise ValueError(f"{self.name}: the training slates are empty, nothing to fit on")
        self.model = SASRec.fit(sequences, self.config, items=items, cache=self.cache)
        self.build = None

    def fit_build(self, train: str | os.PathLike[str]) -> bool:
        """Load the SASRec the build of ``train`` fitted (its ``sasrec`` feature or retriever),
        when ``manifest.json`` beside it records one under these settings, ``train`` is the file
        that build wrote, and the fit is in the cache; whether it did.

        That fit learned from every user's items but their last, in every split (each slate's
        history, never its target), and from the users without a slate
        (:mod:`spdrank.datasets.sasrec_features`): no target of any of the build's slates, as
        this ranker's own fit holds no eval target. Sharing it makes the ranker the model whose
        scores the slates' ``sasrec`` feature holds, and spares a second fit; and since no
        training target is in it either, its scores of the build's training slates are
        leak-free too (``spdrank data features`` reads that from the answer).
        """
        from spdrank.core.files import sha256_file

        train = Path(train)
        if self.model is not None and self.build == train.resolve():
            return True  # loaded already: a teacher asks before it fits, then fits
        manifest_path = train.parent / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        fit = manifest.get(SASREC_FIT) if isinstance(manifest, dict) else None
        written = manifest.get("outputs", {}).get(train.name, {}) if fit else {}
        settings = manifest.get("parameters", {}).get(SASREC) if fit else None
        if not fit or settings != self.config.to_dict() or "sha256" not in written:
            return False
        if written["sha256"] != sha256_file(train):
            return False
        model = SASRec.cached(str(fit.get("key", "")), self.cache)
        if model is None:
            return False
        self.model, self.build = model, train.resolve()
        log.info("%s: the fit the build of %s made (%s)", self.name, train, manifest_path)
        return True

    def scores(self, slate: Slate) -> list[float]:
        """Each candidate's SASRec score after the slate's history, in candidate order."""
        return self.scores_batch([slate])[0]

    def scores_batch(self, slates: Sequence[Slate]) -> list[list[float]]:
        """:meth:`scores` of many slates, their histories through one forward
        (:meth:`SASRec.score_many`)."""
        if self.model is None:
            raise RuntimeError(f"{self.name}: call fit() on training slates before rank()")
        return self.model.score_many(
            [s.query.history or [] for s in slates], [s.docids for s in slates]
        )

    def rank(self, slate: Slate) -> Ranking:
        return self.rank_batch([slate])[0]

    def rank_batch(self, slates: Sequence[Slate]) -> list[Ranking]:
        """Each slate ranked as :meth:`rank` ranks it, the slates' histories through one
        forward (up to ``_ENCODE_BATCH`` slates): for a caller holding many slates, as the
        student's ``SPDRanker.rank_batch`` is; :meth:`rank` is this on one slate."""
        out = []
        for slate, scores in zip(slates, self.scores_batch(slates)):
            docids = slate.docids
            order = sorted(range(len(docids)), key=lambda i: -scores[i])  # ties keep order
            out.append(
                Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])
            )
        return out
