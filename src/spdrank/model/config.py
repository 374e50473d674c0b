"""A checkpoint's settings: what ``config.json`` holds, read back with every field checked.

:class:`SPDConfig` names the backbone (and its LoRA), the head, the prompt, the decoder, the
text fields read and the upstream features with their normalisation. Reading one checks every
size and type before anything is built from it, since a config may come from anywhere.

``SPDConfig()`` is the model ``spdrank train`` fits with no flags (the history head over each
item's words, decoded by expected rank); :meth:`SPDConfig.paper` is the paper's (the
self-attention head over each item's last token, decoded by the Hungarian assignment).

A config.json is written with every field; a model that reads no backbone (``features_only``)
writes the settings only a backbone reads as null (:data:`BACKBONE_ONLY_PROMPT`), so that it
names no LLM it never read. One that lacks some fields was written by an earlier
spdrank: its missing fields are read as that format's values (:data:`FORMAT_1_MISSING`), never
as today's defaults, so that a default changed in code does not change how a saved model
ranks. One that uses a setting this spdrank no longer has is refused, naming it
(:data:`REMOVED_HEAD_KINDS`, :data:`REMOVED_HEAD_SETTINGS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from spdrank.backbone.prompt import UNIT_READOUTS, PromptSettings
from spdrank.backbone.settings import BackboneConfig, ConfigError, bounded_int
from spdrank.core.defaults import (
    HISTORY_READOUT,
    OTHER_READOUT,
    PAPER_DECODER,
    PAPER_HEAD,
    PAPER_READOUT,
    TRAIN_DECODER,
    TRAIN_HEAD,
)
from spdrank.core.features import FeatureNormalizer
from spdrank.core.slates import TEXT_FIELDS
from spdrank.methods.anchor_spec import check_anchor_features, parse_anchor
from spdrank.methods.head_config import HeadConfig

FORMAT_VERSION = 1
#: The checkpoint formats this version reads.
SUPPORTED_FORMAT_VERSIONS = (FORMAT_VERSION,)
#: The largest token budget (per item, per user context) a checkpoint may set: far past any
#: model's context.
MAX_TOKEN_BUDGET = 1 << 20

#: The values a format-1 config.json that lacks a field is read with: each field's value in
#: the spdrank that wrote configs without it. They are written out here, not taken from the
#: records' defaults, because a default may change (``SPDConfig()`` follows ``spdrank
#: train``) while a saved model must rank as it was trained. The backbone's fields, the
#: prompt's template and its instruction are read with their own records' rules.
FORMAT_1_MISSING: dict[str, Any] = {
    "decoder": "hungarian",
    "text_fields": ["title", "text", "contents"],
    "features": None,
    "features_only": False,
}
FORMAT_1_MISSING_HEAD: dict[str, Any] = {
    "kind": "attn", "positions": 64, "width": 256, "layers": 2, "heads": 4, "dropout": 0.1,
    "match": "maxsim", "match_width": 64, "anchor": "none",
}
FORMAT_1_MISSING_PROMPT: dict[str, Any] = {
    "max_item_tokens": 32, "max_query_tokens": 512, "use_chat_template": True,
    "labels": "numbers", "answer_prefix": "", "readout": "last", "history_items": False,
}

#: The prompt's settings that only shape the text a backbone reads. A features-only model
#: writes them as null, and its ``backbone`` record too, and holds them at
#: :class:`PromptSettings`' defaults (:meth:`SPDConfig.without_backbone`). Its template is
#: kept: it says which task the model ranks for (whether it reranks a first stage's order). So
#: are ``readout`` and ``history_items``, which decide how the history head is built.
BACKBONE_ONLY_PROMPT = (
    "max_item_tokens", "max_query_tokens", "use_chat_template", "labels", "answer_prefix",
)

#: Head kinds this spdrank no longer builds, each with what its checkpoint's owner can do.
REMOVED_HEAD_KINDS = {
    "slot": "the slot-query head is no longer part of spdrank; train the model again with "
            "another --head (attn, the paper's, or history, the default)",
}
#: Head settings this spdrank no longer applies, each with what its checkpoint's owner can
#: do. Such a setting at its off value is what every model without it does, and is read.
REMOVED_HEAD_SETTINGS = {
    "standardise": (False, (
        "standardising the backbone's states per dimension (--standardise-states) is no longer "
        "part of spdrank; train the model again without --standardise-states"
    )),
}


def default_prompt(kind: str = TRAIN_HEAD, **settings: Any) -> PromptSettings:
    """The prompt ``spdrank train --head KIND`` builds, with ``settings`` setting any of its
    fields (``template=SEARCH``): a head that reads the history items' states reads each
    item's words and the user context one item a line, the others each item's tokens' mean,
    unless ``settings`` say otherwise; the method then sets what it needs (FIRST's letter
    labels). A ValueError for a kind no method serves."""
    from spdrank.methods.base import method_for

    method = method_for(kind)
    reads_history = kind in method.history_kinds
    return method.prompt(PromptSettings(**({
        "readout": HISTORY_READOUT if reads_history else OTHER_READOUT,
        "history_items": reads_history,
    } | settings)))


@dataclass
class SPDConfig:
    """A model's settings. Each field left out is what ``spdrank train`` uses without the
    matching flag, so ``SPDConfig()`` is the model ``spdrank train`` fits with no flags, and
    ``SPDConfig(head=HeadConfig(kind="attn"))`` the one of ``spdrank train --head attn``;
    :meth:`paper` is the paper's configuration."""

    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    #: None: the prompt ``spdrank train`` builds for the head's kind (:func:`default_prompt`),
    #: set when the config is made.
    prompt: PromptSettings = None  # type: ignore[assignment]
    decoder: str = TRAIN_DECODER
    text_fields: tuple[str, ...] = TEXT_FIELDS
    #: The upstream features the head reads, with their normalisation; None reads none.
    features: FeatureNormalizer | None = None
    #: Read the features alone: no backbone is loaded and no prompt is built.
    features_only: bool = False

    def __post_init__(self) -> None:
        if self.prompt is None:
            self.prompt = default_prompt(self.head.kind)
        check_anchor_features(parse_anchor(self.head.anchor),
                              self.features.names if self.features is not None else ())

    @classmethod
    def paper(cls, **fields: Any) -> SPDConfig:
        """The paper's configuration: the self-attention head (``attn``) over each item's
        last-token state, decoded by the exact (Hungarian) assignment; as ``spdrank train
        --head attn --readout last --decoder hungarian`` trains it. ``fields`` set any other
        field (``backbone``, ``features``, ...) or replace these."""
        paper = {
            "head": HeadConfig(kind=PAPER_HEAD),
            "prompt": PromptSettings(readout=PAPER_READOUT),
            "decoder": PAPER_DECODER,
        }
        return cls(**(paper | fields))

    @property
    def reranks_first_stage(self) -> bool:
        """Whether the model reranks a first stage's list in its order, so that the order it
        is given is a ranking to be judged against: it is anchored to that order, or reads a
        search prompt (whose likelihood teacher scores the query given each passage).
        Recommendation slates shuffle their candidates, and their given order means nothing."""
        return self.head.anchor == "order" or self.prompt.template.likelihood == "query"

    def without_backbone(self) -> SPDConfig:
        """This config with what only a backbone reads at the values a features-only model's
        null record is read as: its backbone the default one without LoRA, the prompt's
        :data:`BACKBONE_ONLY_PROMPT` at their defaults. A features-only model built from any
        backbone flags is then the same model, before it is saved and after it is loaded."""
        unread = PromptSettings()
        return replace(
            self,
            backbone=BackboneConfig(lora=None),
            prompt=replace(self.prompt, **{n: getattr(unread, n) for n in BACKBONE_ONLY_PROMPT}),
        )

    def to_dict(self) -> dict[str, Any]:
        prompt = self.prompt.to_dict()
        if self.features_only:
            prompt |= dict.fromkeys(BACKBONE_ONLY_PROMPT)
        return {
            "format": "spdrank",
            "format_version": FORMAT_VERSION,
            "backbone": None if self.features_only else self.backbone.to_dict(),
            "head": _head_record(self.head, self.prompt),
            "prompt": prompt,
            "decoder": self.decoder,
            "text_fields": list(self.text_fields),
            "features": self.features.to_dict() if self.features is not None else None,
            "features_only": self.features_only,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SPDConfig:
        if data.get("format") != "spdrank":
            raise ValueError("not an spdrank checkpoint config (missing \"format\": \"spdrank\")")
        version = data.get("format_version", FORMAT_VERSION)
        if isinstance(version, bool) or version not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(
                f"format_version {version!r} is not one this spdrank reads (it reads "
                f"{', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))})"
            )
        data = _filled(data)
        # A features-only model's record leaves its backbone-only settings null; any other
        # record carries them (a features-only one written before too) and is read as it is.
        unread = data["backbone"] is None
        if unread and data["features_only"] is not True:
            raise ConfigError(
                "backbone is null, which only a features-only model (features_only: true) "
                "records: this model reads a backbone and must name it"
            )
        prompt = PromptSettings.from_dict(
            _without_nulls(data["prompt"], BACKBONE_ONLY_PROMPT) if unread else data["prompt"]
        )
        # Token budgets: what the prompt is cut to, and what its texts are cut to before
        # they are tokenized.
        bounded_int(prompt.max_item_tokens, "prompt.max_item_tokens", 1, MAX_TOKEN_BUDGET)
        bounded_int(prompt.max_query_tokens, "prompt.max_query_tokens", 1, MAX_TOKEN_BUDGET)
        decoder, fields = data["decoder"], data["text_fields"]
        if not isinstance(decoder, str):
            raise ConfigError(f"decoder must be a decoder's name, got {decoder!r}")
        if not isinstance(fields, (list, tuple)) or not fields \
                or not all(isinstance(f, str) for f in fields):
            raise ConfigError(f"text_fields must be a list of field names, got {fields!r}")
        if data.get("features"):
            _check_features(data["features"])
        return cls(
            backbone=(
                BackboneConfig(lora=None) if unread else BackboneConfig.from_dict(data["backbone"])
            ),
            head=_read_head(data["head"], prompt),
            prompt=prompt,
            decoder=decoder,
            text_fields=tuple(fields),
            features=(
                FeatureNormalizer.from_dict(data["features"]) if data.get("features") else None
            ),
            features_only=bool(data["features_only"]),
        )


def _filled(data: dict[str, Any]) -> dict[str, Any]:
    """A format-1 record with the fields it lacks at :data:`FORMAT_1_MISSING`'s values (the
    head's and the prompt's too, when they are objects: what is not is refused later)."""
    data = FORMAT_1_MISSING | data
    for name, missing in (("head", FORMAT_1_MISSING_HEAD), ("prompt", FORMAT_1_MISSING_PROMPT)):
        if isinstance(data.get(name), dict):
            data[name] = missing | data[name]
    return data


def _without_nulls(record: Any, names: tuple[str, ...]) -> Any:
    """``record`` less those of ``names`` it holds as null, which are then read at their
    defaults (a record that is no object is left for its reader to refuse)."""
    if not isinstance(record, dict):
        return record
    return {k: v for k, v in record.items() if not (k in names and v is None)}


#: The head record's field that restates whether the prompt's readout keeps several states per
#: item. The readout is what says it; the field is written for the spdrank versions that read
#: it from the head, and checked against the readout when read.
UNITS_FIELD = "tokens"


def _head_record(head: HeadConfig, prompt: PromptSettings) -> dict[str, Any]:
    """The head's settings as config.json holds them, with :data:`UNITS_FIELD` in its place
    (before ``match``, whose use it gates)."""
    record: dict[str, Any] = {}
    for name, value in head.to_dict().items():
        if name == "match":
            record[UNITS_FIELD] = prompt.readout in UNIT_READOUTS
        record[name] = value
    return record


def _read_head(data: Any, prompt: PromptSettings) -> HeadConfig:
    """The head's settings from config.json, refusing a :data:`UNITS_FIELD` that disagrees
    with the prompt's readout."""
    if not isinstance(data, dict):
        raise ConfigError(f"head must be an object of settings, got {data!r}")
    data = dict(data)
    kind = data["kind"]
    if isinstance(kind, str) and kind in REMOVED_HEAD_KINDS:
        raise ConfigError(f"head.kind {kind!r}: {REMOVED_HEAD_KINDS[kind]}")
    for name, (off, what) in REMOVED_HEAD_SETTINGS.items():
        if name in data and data.pop(name) is not off:
            raise ConfigError(f"head.{name}: {what}")
    units = data.pop(UNITS_FIELD, None)
    if units is not None and units is not (prompt.readout in UNIT_READOUTS):
        raise ConfigError(
            f"head.{UNITS_FIELD} is {units!r} but the prompt's readout {prompt.readout!r} "
            f"{'keeps one state' if units else 'keeps several states'} per item"
        )
    return HeadConfig.from_dict(data)


def _check_features(data: Any) -> None:
    """Refuse a saved feature normalisation that is not names with finite means and positive,
    finite deviations, one of each per name."""
    names, mean, std = (data.get(k) if isinstance(data, dict) else None
                        for k in ("names", "mean", "std"))
    lists = all(isinstance(v, list) for v in (names, mean, std))
    if not lists or not (len(names) == len(mean) == len(std)) \
            or not all(isinstance(n, str) for n in names):
        raise ConfigError("features must hold 'names', 'mean' and 'std', one of each per name")
    for value in (*mean, *std):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ConfigError(f"features: mean and std must be finite numbers, got {value!r}")
    if any(s <= 0 for s in std):
        raise ConfigError("features: every std must be positive")
