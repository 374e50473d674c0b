"""Rankers other than the student: the baselines (random, popularity, co-occurrence, a feature,
BM25, a dense bi-encoder, SASRec), a TREC run replayed, and sliding windows around any ranker.

Each implements :class:`~spdrank.core.ranking.Ranker`; the commands build them by name
(:mod:`spdrank.commands.named_rankers`). The dataset builders use some as feature sources, so
this layer sits below :mod:`spdrank.datasets`.
"""
