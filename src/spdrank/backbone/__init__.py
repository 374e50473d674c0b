"""The LLM side: a backbone loaded (any Hugging Face model, the bundled GGUF, or a config's
shape with random weights), the prompt a slate becomes, the batch it is padded into, and the
readout that pools the prefill's states for a head.

Imports only :mod:`spdrank.eval` and :mod:`spdrank.core` below it (``tests/test_layers.py``).
"""
