"""Slates from the sources users bring: interaction logs with titles (read, split, candidates
drawn or taken from a retriever, features, built), RecBole atomic files, the bundled Amazon
Beauty, and search runs with their topics, corpora and qrels.
"""
