"""Readout states of a frozen backbone, computed once per slate and stored for head training.

With ``--frozen`` only the head learns, and what it reads of a slate, the hidden state at each
candidate's readout token, is a pure function of the backbone's weights and the slate's prompt
(the tokenizer, the prompt settings, the text fields and the slate's text). Every epoch would
repeat the same prefills, which are nearly all of a step's time. A :class:`StateCache` runs
them once and keeps their output on disk, so the head trains for many epochs at the cost of
reading a few kilobytes per slate.

**Layout.** A cache directory holds the states of the first ``count`` slates of one slate file:

- ``key.json``: what the states are a function of (:func:`cache_key`) and the layout;
- ``shard-00000.safetensors``, ...: slates ``[i * shard_size, (i + 1) * shard_size)`` of the
  file, as ``states`` [sum of their n, D] (each slate's n rows one after another, in the
  storage dtype) and ``sizes`` [slates] (each slate's n; its item mask is the first n of N);
  for a head that reads the user's history, also ``history`` [sum of their h, D] and
  ``history_sizes`` [slates], the history items' states laid out the same way. With the
  ``tokens`` readout a row is a token, not an item: ``tokens`` [sum of their n] (and
  ``history_tokens``) say how many rows each item has.

Nothing is a pickle. States are stored as float16 by default, half of float32's size: the
head's scores from them stay within 2e-3 of their scale of those from float32 states (tested;
about 2e-4 on SmolLM2), and a state beyond float16's range is an error that asks for
``float32`` rather than a silent infinity.

**Resumable.** ``key.json`` is written first, then each shard as a whole (a temporary file,
synced, renamed), so an interrupted build leaves only whole shards, and a rerun checks the
key and computes only the missing ones.

**Never silently stale.** The key holds the backbone's name, a digest of its loaded weights,
its layers and dtype, the prompt settings, the text fields, a digest of the file's first
prompt (it changes with the tokenizer or the prompt code), a digest of the texts the prompts
are made of (each slate's user context and candidate texts, in order), the slate count and
the storage dtype. Opening a cache whose key differs is an error naming every setting that
differs; the cache is never reused, nor overwritten, on a mismatch.

**One cache per text, whatever the labels.** The states depend on the slates' texts only, not
on their labels or features, so the key digests the texts rather than the file: the same
slates labelled by another teacher read the same cache. The digest of every prefix is kept too
(``prefixes``), so a run on the first 512 slates reads a cache built for 8,192 of them (the
prefix of a learning curve) instead of computing its own, and a cache grows to a longer run's
slates when its own begin them: the new slates are computed, those cached are not (a last
shard that was short gets the new slates appended, rewritten whole).

**Below the adapted layers.** With LoRA on the top layers only (``--lora-layers``), the head
does not read fixed states, but the layers below the first adapted one are still frozen: the
cache then holds, for each slate, the states of every prompt token entering that layer
(``states`` [sum of their T, D], ``sizes`` their T), and a batch is the slates' prompts with
those states attached (:attr:`~spdrank.backbone.batching.PromptTensors.lower`), so each step
runs only the adapted layers (:mod:`spdrank.backbone.split`). The key names the layer, and its
weights digest leaves the LoRA adapters out: they change, the layers below do not.

States are computed with the backbone in eval mode, as at inference: a frozen backbone is a
fixed feature extractor, so any dropout it has is off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate, islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from spdrank.backbone.batching import Batch, SlateStates, pad_rows, states_batch
from spdrank.backbone.load import hidden_size
from spdrank.backbone.prompt import UNIT_READOUTS, Cuts, EncodedPrompt
from spdrank.backbone.split import check_split, lower_hidden, split_layer
from spdrank.core.files import atomic_write_bytes, atomic_writer
from spdrank.core.progress import Progress
from spdrank.core.slates import Slate, batched, read_slates
from spdrank.model.cache_settings import (
    CACHE_DTYPES,
    DEFAULT_CACHE_BATCH_SIZE,
    DEFAULT_CACHE_DTYPE,
    check_cacheable,
)
from spdrank.model.ranker import SPDRanker

log = logging.getLogger(__name__)

KEY_NAME = "key.json"
FORMAT = "spdrank-states"
FORMAT_VERSION = 2
#: Slates per shard: the unit of work a rerun skips or redoes.
SHARD_SIZE = 256
#: A shard's metadata field: for each of its slates, ``[candidates, of them cut to the token
#: budget, 1 if its query was cut]``, as the prompts were encoded when the shard was computed,
#: so a run that reads the states reports what was cut in them (:meth:`StateCache.cuts`).
CUTS_FIELD = "cuts"
#: How states may be stored, by name.
STORAGE_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in CACHE_DTYPES}


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def weights_digest(module: nn.Module) -> str:
    """sha256 of a module's tensors (names, shapes, dtypes, bytes), in name order.

    The backbone's name alone would not notice a model directory whose weights changed.
    Hashing costs about one read of the weights, small beside the prefills it saves.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if "lora_" in name:  # adapters train; the cache depends on the frozen weights only
            continue
        flat = tensor.detach().contiguous().reshape(-1)
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(flat.view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


#: Which of a file's slates a cache holds: those a run trains on (None: every one).
Keep = Callable[[Slate], bool] | None


def cached_slates(slates_path: str | os.PathLike[str], keep: Keep = None) -> Iterator[Slate]:
    """The slates a cache holds, in file order: every one, or those ``keep`` accepts (a run
    trains on those only, and its k-th slate is the cache's k-th)."""
    slates = read_slates(slates_path)
    return slates if keep is None else (slate for slate in slates if keep(slate))


def text_digests(
    slates_path: str | os.PathLike[str], count: int, fields: tuple[str, ...], every: int,
    keep: Keep = None,
) -> dict[int, str]:
    """sha256 of the prompt texts of the first k slates, for each multiple k of ``every`` up to
    ``count`` and for ``count`` itself: what the cached states of those slates depend on.
    Hashing is cheap next to parsing the slates, so caches keep every prefix's."""
    digest = hashlib.sha256()
    out: dict[int, str] = {}
    for k, slate in enumerate(islice(cached_slates(slates_path, keep), count), start=1):
        texts = [slate.query.text, slate.candidate_texts(fields)]
        digest.update(json.dumps(texts, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        digest.update(b"\n")
        if k % every == 0 or k == count:
            out[k] = digest.hexdigest()
    if count not in out:
        raise ValueError(f"{slates_path} holds fewer than {count} slates to cache")
    return out


def cached_split(model: SPDRanker) -> int | None:
    """The layer whose input the cache holds for ``model``: its first LoRA-adapted layer when
    LoRA adapts only the top ones; None when the cache holds readout states."""
    lora = model.config.backbone.lora
    return None if lora is None else split_layer(model.backbone, lora.top_layers)


def cache_key(
    model: SPDRanker,
    slates_path: str | os.PathLike[str],
    count: int,
    storage: str,
    texts: str | None = None,
) -> dict[str, Any]:
    """Everything the cached states of the first ``count`` slates of ``slates_path`` depend on;
    ``texts``: their :func:`text_digests` entry for ``count``, when already computed."""
    config = model.config
    first = next(read_slates(slates_path), None)
    if first is None:
        raise ValueError(f"{slates_path} holds no slates to cache")
    if texts is None:
        texts = text_digests(slates_path, count, config.text_fields, every=count)[count]
    prompt = model.encode(first, counted=False)
    split = cached_split(model)
    return ({} if split is None else {"split_layer": split}) | {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "backbone": config.backbone.name_or_path,
        "backbone_weights": weights_digest(model.backbone),
        "layers": config.backbone.layers,
        "dtype": str(next(model.backbone.parameters()).dtype).removeprefix("torch."),
        "prompt": config.prompt.to_dict(),
        "text_fields": list(config.text_fields),
        "first_prompt": hashlib.sha256(
            json.dumps([prompt.input_ids, prompt.item_last]).encode()
        ).hexdigest(),
        "slates": {"path": str(slates_path), "texts": texts, "count": count},
        "storage": storage,
    }


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"prompt": {"max_item_tokens": 8}}`` as ``{"prompt.max_item_tokens": 8}``."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{name}.")
        else:
            out[f"{prefix}{name}"] = value
    return out


def key_differences(cached: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``setting (cached X, now Y)`` for each setting that differs; the path is not compared:
    a moved or copied slate file with the same content is the same data."""
    old, new = _flat(cached), _flat(wanted)
    names = sorted((old.keys() | new.keys()) - {"slates.path"})

    def show(value: Any) -> str:
        text = json.dumps(value)
        return text if len(text) <= 24 else text[:20] + "..."

    return [
        f"{name} (cached {show(old.get(name))}, now {show(new.get(name))})"
        for name in names
        if old.get(name) != new.get(name)
    ]


class StateCache:
    """The readout states of a slate file's slates, read by each slate's place in the file."""

    def __init__(self, directory: Path, key: dict[str, Any], shard_size: int, hidden: int) -> None:
        self.directory = directory
        self.key = key
        self.count = int(key["slates"]["count"])
        self.shard_size = shard_size
        self.hidden = hidden
        #: Rows are tokens or words (the "tokens" and "words" readouts), W at most per item.
        #: The layer whose input each prompt token's row is; None: rows are readout states.
        self.split: int | None = key.get("split_layer")
        self.tokens = self.split is None and key["prompt"].get("readout") in UNIT_READOUTS
        self.width = int(key["prompt"]["max_item_tokens"])
        #: Open shards: the safetensors handle and the row offsets of its slates.
        #: Open shards by (index, tensor name): see :meth:`_shard`.
        self._shards: dict[tuple[int, str], tuple[Any, list[int], list[int], list[int]]] = {}

    def __len__(self) -> int:
        return self.count

    def cuts(self) -> Cuts | None:
        """How many candidates and queries of the cached slates were cut to their token
        budgets when their prompts were encoded for the cache (in this run or an earlier
        one); None when a shard was written without these counts."""
        total = Cuts()
        for index in range(-(-self.count // self.shard_size)):
            path = self.directory / shard_name(index)
            with safe_open(str(path), framework="pt") as handle:
                rows = _recorded_cuts(handle)
            if rows is None:
                return None
            for candidates, cut, query_cut in rows[: self.shard_slates(index)]:
                total.candidates += candidates
                total.candidates_cut += cut
                total.queries += 1
                total.queries_cut += query_cut
        return total

    def missing_shards(self) -> list[int]:
        shards = range(-(-self.count // self.shard_size))
        return [i for i in shards if not (self.directory / shard_name(i)).exists()]

    def shard_slates(self, index: int) -> int:
        """How many slates shard ``index`` holds when complete."""
        return min(self.shard_size, self.count - index * self.shard_size)

    def short_shards(self) -> dict[int, int]:
        """``{shard: slates it holds}`` for each shard on disk that holds fewer slates than the
        cache now covers (the last one of a cache that grew)."""
        out: dict[int, int] = {}
        missing = set(self.missing_shards())
        for index in range(-(-self.count // self.shard_size)):
            if index in missing:
                continue
            path = self.directory / shard_name(index)
            try:
                with safe_open(str(path), framework="pt") as handle:
                    held = handle.get_slice("sizes").get_shape()[0]
            except (SafetensorError, KeyError) as exc:
                raise ValueError(
                    f"{path} is not a readable shard ({exc}): delete it and rerun to compute it "
                    "again"
                ) from None
            if held < self.shard_slates(index):
                out[index] = held
        return out

    def _shard(
        self, index: int, name: str = "states"
    ) -> tuple[Any, list[int], list[int], list[int]]:
        """The open shard ``index``; the row offsets and item offsets of its slates in tensor
        ``name``, and each item's row count (all 1 unless a row is a token)."""
        if (index, name) not in self._shards:
            path = self.directory / shard_name(index)
            if not path.exists():
                raise FileNotFoundError(f"{path} is missing: the cache is incomplete, rebuild it")
            prefix = "" if name == "states" else f"{name}_"
            try:
                handle = safe_open(str(path), framework="pt")
                sizes = handle.get_tensor(f"{prefix}sizes" if prefix else "sizes").tolist()
                lengths = (
                    handle.get_tensor(f"{prefix}tokens").tolist()
                    if self.tokens else [1] * sum(sizes)
                )
            except (SafetensorError, KeyError) as exc:
                raise ValueError(
                    f"{path} is not a readable shard ({exc}): delete it and rerun to compute it "
                    "again"
                ) from None
            items = [0, *accumulate(sizes)]
            token_rows = [0, *accumulate(lengths)]
            rows = [token_rows[start] for start in items]
            self._shards[index, name] = (handle, rows, items, lengths)
        return self._shards[index, name]

    def slate_states(self, index: int, name: str = "states") -> torch.Tensor:
        """The [n, D] float32 readout states of the file's slate ``index`` (0-based); with
        ``name="history"``, the [h, D] states of its history items. With the tokens readout,
        the rows are the items' tokens, one item after another (see :meth:`slate_tokens`)."""
        if not 0 <= index < self.count:
            raise IndexError(f"slate {index} is outside the cache's 0:{self.count}")
        handle, rows, _, _ = self._shard(index // self.shard_size, name)
        row = index % self.shard_size
        return handle.get_slice(name)[rows[row] : rows[row + 1]].float()

    def slate_tokens(self, index: int, name: str = "states") -> tuple[torch.Tensor, torch.Tensor]:
        """With the tokens readout: slate ``index``'s items as [n, W, D] token states (padded
        slots 0) and their token counts [n]."""
        flat = self.slate_states(index, name)
        _, _, items, lengths = self._shard(index // self.shard_size, name)
        row = index % self.shard_size
        counts = torch.tensor(lengths[items[row] : items[row + 1]], dtype=torch.long)
        out = torch.zeros((len(counts), self.width, self.hidden))
        for i, part in enumerate(torch.split(flat, counts.tolist())):
            out[i, : len(part)] = part
        return out, counts

    def _slate_states(
        self, indices: Sequence[int], name: str
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """The slates' cached items of tensor ``name``, one [n, D] tensor per slate (tokens
        readout: [n, W, D], with each item's token count [n])."""
        if not self.tokens:
            return [self.slate_states(i, name) for i in indices], None
        read = [self.slate_tokens(i, name) for i in indices]
        return [x for x, _ in read], [counts for _, counts in read]

    def batch(self, indices: Sequence[int], slates: Sequence[Slate], model: SPDRanker) -> Batch:
        """The batch ``model`` reads for ``slates``, the file's slates at ``indices``: their
        cached states, padded as a prefill's batch is, and their features read from the
        slates themselves. Below adapted layers, the slates' prompts with their cached
        states attached."""
        if self.split is not None:
            return self._prompt_batch(indices, slates, model)
        items, item_tokens = self._slate_states(indices, "states")
        for index, slate, states in zip(indices, slates, items, strict=True):
            if len(states) != len(slate):
                raise ValueError(
                    f"{self.directory} holds {len(states)} states for slate {index}, which has "
                    f"{len(slate)} candidates: the cache is not of this slate file"
                )
        cached = SlateStates(items, item_tokens)
        if model.reads_history:
            cached.history, cached.history_tokens = self._slate_states(indices, "history")
        return states_batch(cached, [model.slate_features(s) for s in slates])


    def _prompt_batch(
        self, indices: Sequence[int], slates: Sequence[Slate], model: SPDRanker
    ) -> Batch:
        """The slates' prompts as a prefill's batch, with the states entering the split layer
        of every prompt token attached (padded with zeros, as the prompt is with padding)."""
        batch = model.collate([model.encode(s) for s in slates])
        prompt = batch.prompt
        lengths = prompt.attention_mask.sum(1).tolist()
        rows = [self.slate_states(i) for i in indices]
        for index, row, length in zip(indices, rows, lengths, strict=True):
            if len(row) != length:
                raise ValueError(
                    f"{self.directory} holds {len(row)} token states for slate {index}, whose "
                    f"prompt is {length} tokens: the cache is not of this slate file"
                )
        lower = pad_rows(rows, prompt.input_ids.shape[1], (self.hidden,), dtype=np.float32)
        prompt.lower, prompt.lower_layer = lower.to(model.device), self.split
        return batch


def open_state_cache(
    directory: str | os.PathLike[str],
    model: SPDRanker,
    slates_path: str | os.PathLike[str],
    count: int,
    storage: str = DEFAULT_CACHE_DTYPE,
    batch_size: int = DEFAULT_CACHE_BATCH_SIZE,
    shard_size: int = SHARD_SIZE,
    progress: bool = True,
    keep: Keep = None,
) -> StateCache:
    """The cache of ``model``'s readout states for the first ``count`` slates of
    ``slates_path`` in ``directory`` (of those ``keep`` accepts, when given): checked against
    its key, and completed first (built, or resumed where an earlier build stopped) with
    prefills of ``batch_size`` slates.

    Raises ValueError naming the settings that differ when ``directory`` holds a cache made
    with others, and for a model whose states cannot be cached.
    """
    check_cacheable(
        model.method,
        frozen=model.config.backbone.lora is None or cached_split(model) is not None,
        split=model.config.backbone.lora is not None and cached_split(model) is not None,
        features_only=model.config.features_only,
        dtype=storage,
        batch_size=batch_size,
    )
    if shard_size < 1:
        raise ValueError(f"the shard size must be at least 1, got {shard_size}")
    directory = Path(directory)
    meta_path = directory / KEY_NAME
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else None
    if meta is not None:
        shard_size, hidden = meta["shard_size"], meta["hidden"]
    digests = text_digests(slates_path, count, model.config.text_fields, every=1, keep=keep)
    key = cache_key(model, slates_path, count, storage, digests[count])
    if meta is not None:
        differences = key_differences(_cached_key_for(meta, count, digests), key)
        if differences:
            raise ValueError(
                f"{directory} holds states cached with other settings: "
                + "; ".join(differences)
                + ". Delete it, or choose another cache directory"
            )
        if count > int(meta["key"]["slates"]["count"]):  # grown: the key now covers them all
            prefixes = meta.get("prefixes", {}) | {str(k): v for k, v in digests.items()}
            with atomic_writer(meta_path) as fh:
                fh.write(json.dumps(meta | {"key": key, "prefixes": prefixes}, indent=1) + "\n")
    elif directory.exists() and any(directory.iterdir()):
        raise ValueError(f"{directory} is not empty and holds no {KEY_NAME}: not a state cache")
    else:
        hidden = hidden_size(model.backbone)
        with atomic_writer(meta_path) as fh:
            meta = {
                "key": key,
                "shard_size": shard_size,
                "hidden": hidden,
                "prefixes": {str(k): v for k, v in digests.items()},
            }
            fh.write(json.dumps(meta, indent=1) + "\n")
    cache = StateCache(directory, key, shard_size, hidden)
    _complete(cache, model, slates_path, STORAGE_DTYPES[storage], batch_size, progress, keep)
    return cache


def _cached_key_for(
    meta: dict[str, Any], count: int, digests: dict[int, str]
) -> dict[str, Any]:
    """The cached key as it reads for a run on the first ``count`` slates.

    A cache of more slates holds a shorter run's when its digest of that prefix matches; a
    cache whose slates begin the wanted ones grows by the rest.
    Otherwise the key is as cached, and the slate count or texts differ.
    """
    key = meta["key"]
    cached = int(key["slates"]["count"])
    texts = None
    if count < cached:
        texts = meta.get("prefixes", {}).get(str(count))
    elif count > cached:
        texts = digests[count] if digests.get(cached) == key["slates"]["texts"] else None
    if texts is None:
        return key
    return key | {"slates": key["slates"] | {"texts": texts, "count": count}}


def _complete(
    cache: StateCache,
    model: SPDRanker,
    slates_path: str | os.PathLike[str],
    storage: torch.dtype,
    batch_size: int,
    progress: bool,
    keep: Keep = None,
) -> None:
    """Compute and write the shards the cache lacks, and the slates a short shard lacks (its
    cached slates read back, the new ones appended, the shard rewritten whole)."""
    missing = set(cache.missing_shards())
    short = cache.short_shards()
    if not missing and not short:
        return
    todo = sum(cache.shard_slates(i) for i in missing) + sum(
        cache.shard_slates(i) - held for i, held in short.items()
    )
    done = cache.count - todo
    log.info(
        "cache states: %s of %s slates to compute (%s already cached) into %d shard%s of %s "
        "in %s, prefills of %d slates",
        f"{todo:,}", f"{cache.count:,}", f"{done:,}", len(missing) + len(short),
        "" if len(missing) + len(short) == 1 else "s", f"{cache.shard_size:,}",
        cache.directory, batch_size,
    )
    bar = Progress(
        "cache states", unit="slate", total=cache.count, initial=done,
        mode=None if progress else False,
    )
    shards = batched(islice(cached_slates(slates_path, keep), cache.count), cache.shard_size)
    was_training = model.training
    model.eval()
    try:
        if cache.split is not None:
            _check_split(model, slates_path, cache.split)
        for index, slates in enumerate(shards):
            if index not in missing and index not in short:
                continue
            path = cache.directory / shard_name(index)
            held = short.get(index, 0)
            cuts: list[list[int]] | None = []
            tensors = _shard_tensors(model, slates[held:], storage, batch_size, bar, cuts)
            if held:
                tensors, cuts = _appended(path, tensors, cuts)
            metadata = None if cuts is None else {CUTS_FIELD: json.dumps(cuts)}
            atomic_write_bytes(path, save(tensors, metadata=metadata))
    finally:
        model.train(was_training)
        bar.close()


def _appended(
    path: Path, tensors: dict[str, torch.Tensor], cuts: list[list[int]]
) -> tuple[dict[str, torch.Tensor], list[list[int]] | None]:
    """The shard at ``path`` with ``tensors`` (later slates of it) appended: every tensor of a
    shard lists its slates' rows one after another, so appending is concatenating each; and
    its slates' cut counts followed by ``cuts`` (None when the shard recorded none)."""
    with safe_open(str(path), framework="pt") as handle:
        if set(handle.keys()) != set(tensors):
            raise ValueError(
                f"{path} holds {sorted(handle.keys())}, not the {sorted(tensors)} this cache "
                "writes: delete it and rerun to compute it again"
            )
        held = _recorded_cuts(handle)
        joined = {name: torch.cat([handle.get_tensor(name), new]) for name, new in tensors.items()}
    return joined, None if held is None else held + cuts


def _recorded_cuts(handle: Any) -> list[list[int]] | None:
    """A shard's recorded cut counts, one row a slate; None for a shard that recorded none."""
    text = (handle.metadata() or {}).get(CUTS_FIELD)
    return None if text is None else json.loads(text)


def _encoded(model: SPDRanker, slates: Sequence[Slate], cuts: list[list[int]]) -> list[EncodedPrompt]:
    """The slates' prompts, each slate's ``[candidates, cut, query cut]`` appended to ``cuts``."""
    encoded = [model.encode(s) for s in slates]
    cuts.extend([len(e.truncated), sum(e.truncated), int(bool(e.query_truncated))]
                for e in encoded)
    return encoded


def _check_split(model: SPDRanker, slates_path: str | os.PathLike[str], layer: int) -> None:
    """Refuse to cache the states entering ``layer`` when the backbone's two halves, run on
    the file's first slate, do not make its whole prefill."""
    first = next(read_slates(slates_path))
    prompt = model.collate([model.encode(first, counted=False)]).prompt
    check_split(model.backbone, prompt.input_ids, prompt.attention_mask, layer)


def _lower_tensors(
    model: SPDRanker, slates: list[Slate], storage: torch.dtype, batch_size: int,
    bar: Progress, layer: int, cuts: list[list[int]],
) -> dict[str, torch.Tensor]:
    """A shard's tensors of the states entering ``layer``: every real prompt token's row;
    each slate's cut counts appended to ``cuts``."""
    rows: list[torch.Tensor] = []
    for chunk in batched(slates, batch_size):
        prompt = model.collate(_encoded(model, chunk, cuts)).prompt
        with torch.inference_mode():
            lower = lower_hidden(model.backbone, prompt.input_ids, prompt.attention_mask, layer)
        lengths = prompt.attention_mask.sum(1).tolist()
        rows.extend(lower[i, :t].cpu() for i, t in enumerate(lengths))
        bar.update(len(chunk))
    return {"states": _stored(rows, storage), "sizes": torch.tensor([len(r) for r in rows])}


def _shard_tensors(
    model: SPDRanker, slates: list[Slate], storage: torch.dtype, batch_size: int, bar: Progress,
    cuts: list[list[int]],
) -> dict[str, torch.Tensor]:
    """A shard's tensors of ``slates``; each slate's cut counts appended to ``cuts``."""
    split = cached_split(model)
    if split is not None:
        return _lower_tensors(model, slates, storage, batch_size, bar, split, cuts)
    rows: list[torch.Tensor] = []
    history_rows: list[torch.Tensor] = []
    history_sizes: list[int] = []
    tokens: list[int] = []
    history_tokens: list[int] = []
    for chunk in batched(slates, batch_size):
        batch = model.collate(_encoded(model, chunk, cuts))
        with torch.inference_mode():
            inputs = model.read(batch)
        real = [len(s) for s in chunk]
        rows.extend(_rows(inputs.items, real, inputs.item_tokens, tokens))
        if inputs.history is not None:
            real = batch.history_mask.sum(1).tolist()
            history_sizes.extend(real)
            history_rows.extend(_rows(inputs.history, real, inputs.history_tokens, history_tokens))
        bar.update(len(chunk))
    tensors = {"states": _stored(rows, storage), "sizes": torch.tensor([len(s) for s in slates])}
    if model.reads_history:
        tensors["history"] = _stored(history_rows, storage)
        tensors["history_sizes"] = torch.tensor(history_sizes)
    if model.config.prompt.readout in UNIT_READOUTS:
        tensors["tokens"] = torch.tensor(tokens)
        if model.reads_history:
            tensors["history_tokens"] = torch.tensor(history_tokens)
    return tensors


def _rows(
    states: torch.Tensor, real: list[int], lengths: torch.Tensor | None, counts: list[int]
) -> list[torch.Tensor]:
    """Each slate's rows of ``states`` [B, M, (W,) D]: its first ``real`` items, and with token
    ``lengths`` each item's real tokens one after another (their counts appended to ``counts``)."""
    out = []
    for i, n in enumerate(real):
        if lengths is None:
            out.append(states[i, :n].cpu())
            continue
        kept = lengths[i, :n].tolist()
        counts.extend(kept)
        out.append(torch.cat([states[i, j, :k] for j, k in enumerate(kept)]).cpu()
                   if n else states.new_zeros((0, states.size(-1))).cpu())
    return out


def _stored(rows: list[torch.Tensor], storage: torch.dtype) -> torch.Tensor:
    """Rows concatenated in the storage dtype; an error where they exceed its range."""
    stored = torch.cat(rows).to(storage)
    if not torch.isfinite(stored).all():
        raise ValueError(
            f"readout states exceed {storage}'s range (largest magnitude "
            f"{torch.cat(rows).abs().max().item():.4g}): use --cache-dtype float32"
        )
    return stored.contiguous()
