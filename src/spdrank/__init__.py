"""spdrank: single-pass generative reranking (SPD).

One prefill of a decoder-only LLM over a prompt holding the user context and N candidates,
a light head mapping each candidate's hidden state to N x K item-position scores, and a
linear-assignment decode that returns a valid permutation by construction.
"""

__version__ = "0.1.0"
