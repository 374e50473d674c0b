"""The data model and the leaves every layer stands on: slates and rankings, the one gate for
JSON input, files written atomically, TREC files, progress, defaults, the stage clock.

The lowest layer: it imports nothing else of spdrank (``tests/test_layers.py``), and nothing
here imports torch.
"""
