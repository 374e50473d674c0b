"""Slates from the sources users bring: interaction logs with titles (read, split, candidates
drawn or taken from a retriever, features, built), RecBole atomic files, the bundled Amazon
Beauty, search runs with their topics, corpora and qrels, and a corpus alone (synthetic
queries).
"""
