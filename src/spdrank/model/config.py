"""A checkpoint's settings: what ``config.json`` holds, read back with every field checked.

:class:`SPDConfig` names the backbone (and its LoRA), the head, the prompt, the decoder, the
text fields read and the upstream features with their normalisation. Reading one checks every
size and type before anything is built from it, since a config may come from anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from spdrank.backbone.prompt import UNIT_READOUTS, PromptSettings
from spdrank.backbone.settings import BackboneConfig, ConfigError, bounded_int
from spdrank.core.defaults import UNNAMED_DECODER
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


@dataclass
class SPDConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    decoder: str = UNNAMED_DECODER
    text_fields: tuple[str, ...] = TEXT_FIELDS
    #: The upstream features the head reads, with their normalisation; None reads none.
    features: FeatureNormalizer | None = None
    #: Read the features alone: no backbone is loaded and no prompt is built.
    features_only: bool = False

    def __post_init__(self) -> None:
        check_anchor_features(parse_anchor(self.head.anchor),
                              self.features.names if self.features is not None else ())

    @property
    def reranks_first_stage(self) -> bool:
        """Whether the model reranks a first stage's list in its order, so that the order it
        is given is a ranking to be judged against: it is anchored to that order, or reads a
        search prompt (whose likelihood teacher scores the query given each passage).
        Recommendation slates shuffle their candidates, and their given order means nothing."""
        return self.head.anchor == "order" or self.prompt.template.likelihood == "query"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "spdrank",
            "format_version": FORMAT_VERSION,
            "backbone": self.backbone.to_dict(),
            "head": _head_record(self.head, self.prompt),
            "prompt": self.prompt.to_dict(),
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
        prompt = PromptSettings.from_dict(data["prompt"])
        # Token budgets: what the prompt is cut to, and what its texts are cut to before
        # they are tokenized.
        bounded_int(prompt.max_item_tokens, "prompt.max_item_tokens", 1, MAX_TOKEN_BUDGET)
        bounded_int(prompt.max_query_tokens, "prompt.max_query_tokens", 1, MAX_TOKEN_BUDGET)
        decoder, fields = data.get("decoder", UNNAMED_DECODER), data.get("text_fields", TEXT_FIELDS)
        if not isinstance(decoder, str):
            raise ConfigError(f"decoder must be a decoder's name, got {decoder!r}")
        if not isinstance(fields, (list, tuple)) or not fields \
                or not all(isinstance(f, str) for f in fields):
            raise ConfigError(f"text_fields must be a list of field names, got {fields!r}")
        if data.get("features"):
            _check_features(data["features"])
        return cls(
            backbone=BackboneConfig.from_dict(data["backbone"]),
            head=_read_head(data["head"], prompt),
            prompt=prompt,
            decoder=data.get("decoder", UNNAMED_DECODER),
            text_fields=tuple(data.get("text_fields", TEXT_FIELDS)),
            features=(
                FeatureNormalizer.from_dict(data["features"]) if data.get("features") else None
            ),
            features_only=bool(data.get("features_only", False)),
        )


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
