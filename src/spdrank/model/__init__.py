"""The student as one object: :class:`~spdrank.model.ranker.SPDRanker` (build, load, save,
forward, rank), its settings (:mod:`.config`), its files (:mod:`.checkpoint`) and the backbone
and tokenizer it is built over (:mod:`.parts`).

"SPD" names the single-pass family: the same class is SPD's matrix model and its single-pass
peers (scalar, FIRST, pointwise), the ranking method of its head kind deciding which. It sits
above :mod:`spdrank.methods`, which it asks, and below everything that ranks with it.
"""
