"""What a student's scores start from, as the text a checkpoint's ``head.anchor`` holds.

A student is worth deploying only where it ranks better than what a team already runs, and
the strongest ranker it reads is often not the order its candidates arrive in: a search team
hands BM25's top 100 with a dense retriever's cosine beside it, a recommender's slates carry
SASRec's score. So a student may start from any of them and learn a correction
(:mod:`spdrank.methods.anchor` computes the prior):

- ``none``: no prior, the head's scores alone;
- ``order``: the order the candidates are given in (the first stage's);
- ``feature:NAME``: the order of one feature the model reads, highest first, equal values in
  the order given (as ``spdrank eval --ranker feature:NAME`` ranks);
- ``feature:0.7*dense+0.3*score``: the order of a weighted sum of features the model reads,
  each z-scored as the model normalises it (a blend).

The spec is text so that ``config.json`` stays readable and a checkpoint loads without torch;
this module parses and writes it and checks it against the features a model reads. Whether
the feature names exist is a property of the whole model config (:mod:`spdrank.model.config`),
so it is checked there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spdrank.backbone.settings import ConfigError
from spdrank.core.defaults import ANCHORS

#: The prefix of an anchor on the candidates' features.
FEATURE_ANCHOR = "feature:"
#: ``spdrank train --anchor best``: chosen on the validation slates among the given order and
#: every feature the student reads (resolved to one of the specs above before training).
BEST_ANCHOR = "best"
#: The most features one blend may weigh.
MAX_BLEND = 64


@dataclass(frozen=True)
class AnchorSpec:
    """A parsed anchor: ``kind`` is ``none``, ``order`` or ``feature``; a feature anchor's
    ``weights`` are ``(name, weight)`` pairs, in the order written."""

    kind: str
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def anchored(self) -> bool:
        return self.kind != "none"

    @property
    def names(self) -> tuple[str, ...]:
        """The features the prior reads."""
        return tuple(name for name, _ in self.weights)

    def text(self) -> str:
        """The spec as ``head.anchor`` holds it (a single feature of weight 1 as its name)."""
        if self.kind != "feature":
            return self.kind
        if len(self.weights) == 1 and self.weights[0][1] == 1.0:
            return FEATURE_ANCHOR + self.weights[0][0]
        return FEATURE_ANCHOR + "+".join(f"{weight:g}*{name}" for name, weight in self.weights)


def feature_anchor(name: str) -> str:
    """The spec of an anchor on one feature."""
    return FEATURE_ANCHOR + name


#: The largest weight of a weighted anchor (and 1 over it the smallest): only the weights'
#: ratios decide the order, and a weight near float32's range (3.4e38) overflows the sum.
MAX_WEIGHT = 1e6


def parse_anchor(text: object) -> AnchorSpec:
    """``text`` as an :class:`AnchorSpec`; a ``ValueError`` naming what is wrong otherwise."""
    if not isinstance(text, str):
        raise ConfigError(f"an anchor is text, got {text!r}")
    if text in ANCHORS:
        return AnchorSpec(text)
    if not text.startswith(FEATURE_ANCHOR):
        raise ValueError(
            f"unknown anchor {text!r}: use {', '.join(ANCHORS)}, or {FEATURE_ANCHOR}NAME (a "
            f"feature the model reads), or {FEATURE_ANCHOR}0.7*NAME+0.3*OTHER (a blend)"
        )
    body = text[len(FEATURE_ANCHOR):]
    terms = body.split("+")
    if not body or len(terms) > MAX_BLEND:
        raise ValueError(f"anchor {text!r}: name between 1 and {MAX_BLEND} features after "
                         f"{FEATURE_ANCHOR!r}")
    weights: list[tuple[str, float]] = []
    for term in terms:
        weight_text, star, name = term.partition("*")
        if not star:
            weight_text, name = "1", term
        name = name.strip()
        try:
            weight = float(weight_text)
        except ValueError:
            raise ValueError(f"anchor {text!r}: {weight_text!r} is not a weight (write "
                             "0.7*NAME)") from None
        if not name:
            raise ValueError(f"anchor {text!r}: a term names no feature")
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"anchor {text!r}: the weight of {name!r} must be a finite number "
                             f"above 0, got {weight_text!r}")
        if not 1 / MAX_WEIGHT <= weight <= MAX_WEIGHT:
            raise ValueError(f"anchor {text!r}: the weight of {name!r} is {weight_text}; only "
                             "the weights' ratios order the sum, so write them between "
                             f"{1 / MAX_WEIGHT:g} and {MAX_WEIGHT:g} (the head computes the sum "
                             "in float32)")
        if name in (n for n, _ in weights):
            raise ValueError(f"anchor {text!r} names {name!r} twice")
        weights.append((name, weight))
    return AnchorSpec("feature", tuple(weights))


def check_anchor_features(spec: AnchorSpec, features: tuple[str, ...]) -> None:
    """Refuse a feature anchor on a feature the model does not read: its prior reads the same
    normalised values the head does, so it can only order by those."""
    missing = [name for name in spec.names if name not in features]
    if missing:
        have = ", ".join(features) or "none"
        raise ValueError(
            f"head.anchor {spec.text()!r} orders by {', '.join(missing)}, which the model does "
            f"not read (its features: {have}); add it to --features"
        )
