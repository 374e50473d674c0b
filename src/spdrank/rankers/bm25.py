"""``slate_bm25``: a query-passage lexical baseline, BM25 over the slate's own passages.

A search slate's floor is lexical overlap between the query and each passage. This ranker
indexes the slate's candidates alone (document frequencies from those N passages, since a
reranker sees nothing else) and scores the query with BM25 (Lucene's variant, k1 = 0.9,
b = 0.4, Anserini's defaults for MS MARCO passages), through ``bm25s``. English stopwords
are dropped and no stemmer is applied, so the ranking depends on the texts alone.

It is not the BM25 of a first stage: there, document frequencies and lengths come from the
whole collection, and a word common in the slate (every passage retrieved for the query holds
the query's words) is rare in the collection. With the slate's own statistics those words
weigh little, so it ranks a first stage's list well below that first stage's own order.
Hence its name, ``slate_bm25``; the first stage's own BM25 order is the ``retriever``
baseline. ``bm25`` still names it, as a deprecated alias that says so
(:data:`spdrank.rankers.baselines.DEPRECATED_NAMES`).

A query or passage with no indexable word scores 0 everywhere; equal scores keep the slate's
candidate order, so the output is deterministic and its ties are visible in the scores.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from spdrank.core.ranking import Ranking
from spdrank.core.slates import TEXT_FIELDS, Slate

#: The ranker's name: BM25 with the slate as its collection.
NAME = "slate_bm25"

#: Anserini's BM25 parameters for MS MARCO passages.
K1 = 0.9
B = 0.4


def tokenize(texts: list[str]) -> list[list[str]]:
    """Each text's BM25 terms as every BM25 of spdrank reads them: English stopwords dropped,
    no stemmer (the slate's own passages here, a whole corpus for synthetic queries' filter)."""
    import bm25s

    # bm25s logs every index it builds at DEBUG: one a slate, nothing a user acts on.
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=False)


class BM25Ranker:
    """Candidates by BM25 between the query text and each candidate's text."""

    needs_train = False
    ranks_by_scores = True

    def __init__(self, name: str = NAME, k1: float = K1, b: float = B) -> None:
        self.name = name
        self.k1 = k1
        self.b = b

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: each slate is its own collection."""

    def scores(self, slate: Slate) -> list[float]:
        """BM25 of the query against each candidate, in candidate order."""
        import bm25s

        texts = slate.candidate_texts(TEXT_FIELDS)
        corpus = tokenize(texts)
        query = tokenize([slate.query.text])[0]
        vocabulary = {t for doc in corpus for t in doc}
        terms = [t for t in query if t in vocabulary]
        if not terms or not any(corpus):
            return [0.0] * len(texts)
        index = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        index.index(corpus, show_progress=False)
        return [float(s) for s in index.get_scores(terms)]

    def rank(self, slate: Slate) -> Ranking:
        docids = slate.docids
        scores = self.scores(slate)
        order = sorted(range(len(docids)), key=lambda i: -scores[i])
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])
