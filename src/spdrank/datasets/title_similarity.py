"""A lexical retriever's score per candidate: how close its title is to the user's history.

A reranking slate usually arrives from a retriever, with the retriever's score per candidate.
Beauty ships no retriever, so the builder computes the score a plain lexical one would give:
the TF-IDF cosine between the candidate's title and each of the user's history titles, the
largest of them (``title_similarity``). Brands, product lines and shades repeat in titles
("Maybelline ... Mascara", "OPI Nail Lacquer, ..."), and a user who buys within a brand or a
line is the case the co-occurrence counts miss when the pair was never bought together.

Only item metadata is used, never an interaction: the IDF is counted over the titles of the
log's items (the catalogue), the same for every split, so the score holds no label.

Tokens are the lower-cased runs of letters and digits (``"8.5 Ounce"`` gives ``8``, ``5``,
``ounce``); the score is rounded to 6 decimals, like the interaction features, so files do
not depend on the last bit of a platform's ``log``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

_TOKEN = re.compile(r"[^\W_]+")


def tokens(title: str) -> list[str]:
    """The lower-cased runs of letters and digits of ``title``."""
    return _TOKEN.findall(title.lower())


class TitleSimilarity:
    """TF-IDF cosine of a candidate's title with the closest of the history's titles."""

    def __init__(
        self,
        catalogue: Iterable[str],
        decimals: int = 6,
        tokenize: Callable[[str], list[str]] = tokens,
    ) -> None:
        """``catalogue``: every item's title once (the IDF's documents). ``tokenize``: a
        title's terms (by default its words; a language model's token ids, written as text,
        give the same score over what that model reads)."""
        self.tokenize = tokenize
        df: Counter[str] = Counter()
        n = 0
        for title in catalogue:
            df.update(set(tokenize(title)))
            n += 1
        # Smoothed as scikit-learn's TfidfVectorizer: a token in every title still weighs > 0.
        self.idf = {t: math.log((1 + n) / (1 + c)) + 1.0 for t, c in df.items()}
        self.unseen_idf = math.log(1 + n) + 1.0
        self.decimals = decimals
        self._vectors: dict[str, dict[str, float]] = {}

    def vector(self, title: str) -> dict[str, float]:
        """The unit-length TF-IDF vector of ``title`` (cached: titles repeat across slates)."""
        cached = self._vectors.get(title)
        if cached is not None:
            return cached
        tf = Counter(self.tokenize(title))
        weights = {t: c * self.idf.get(t, self.unseen_idf) for t, c in tf.items()}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        vector = {t: w / norm for t, w in weights.items()} if norm else {}
        self._vectors[title] = vector
        return vector

    def __call__(self, history: Sequence[str], candidates: Sequence[str]) -> list[float]:
        """Per candidate title, its largest cosine with a history title (0.0 without history)."""
        history_vectors = [self.vector(h) for h in history]
        out = []
        for title in candidates:
            c = self.vector(title)
            best = 0.0
            for h in history_vectors:
                small, large = (c, h) if len(c) <= len(h) else (h, c)
                best = max(best, sum(w * large.get(t, 0.0) for t, w in small.items()))
            out.append(round(best, self.decimals))
        return out

