"""Ranking methods: what one way of ranking owns, behind one interface, found by head kind.

Each method is a package here (as peft keeps each tuner under ``tuners/<method>/``) owning its
heads, its loss and its decoding: :mod:`.spd` (an N x K item-position matrix, decoded by
assignment), :mod:`.scalar` (one score per item, sorted), :mod:`.first` (FIRST: the LM's
first-token logits over candidate letters, sorted) and :mod:`.pointwise` (the cross-encoder
peer: one sequence a candidate, one score each, sorted). :mod:`.base` holds the interface and the
registry; importing this package registers the built-in methods, so a new method is one
package whose :class:`~spdrank.methods.base.RankingMethod` is passed to
:func:`~spdrank.methods.base.register`.
"""

from spdrank.methods.base import (
    RankingMethod,
    head_kinds,
    method_for,
    methods,
    register,
    unregister,
)
from spdrank.methods.first.method import FirstMethod
from spdrank.methods.pointwise.method import PointwiseMethod
from spdrank.methods.scalar.method import ScalarMethod
from spdrank.methods.spd.method import SPDMethod

for _method in (SPDMethod(), ScalarMethod(), FirstMethod(), PointwiseMethod()):
    register(_method)

__all__ = ["RankingMethod", "head_kinds", "method_for", "methods", "register", "unregister"]
