"""The LLM side: a backbone's settings, the checks before it is read, where it is (any Hugging
Face model, a packaged GGUF, or a config's shape with random weights), its loading, the prompt
a slate becomes, the batch it is padded into, and the readout that pools the prefill's states
for a head.

Imports only :mod:`spdrank.eval` and :mod:`spdrank.core` below it (``tests/test_layers.py``).
"""
