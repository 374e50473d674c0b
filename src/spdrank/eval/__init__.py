"""Quality: the metrics against clicks, graded judgements (trec_eval's semantics, named as
ir-measures names them) and a reference ranking, paired intervals, and the evaluation of any
rankers on the same slates.

It knows rankers only through the :class:`~spdrank.core.ranking.Ranker` protocol, so it sits
just above :mod:`spdrank.core`, and training, the bench and the commands all measure with it.
"""
