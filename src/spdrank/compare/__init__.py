"""``spdrank bench``: the paper's tables side by side, from one process on the same slates.

- :mod:`spdrank.compare.decoders`: one SPD checkpoint under every decoder, one forward per slate;
- :mod:`spdrank.compare.latency`: the latency decomposition (Table 5) at several slate sizes;
- :mod:`spdrank.compare.report`: speed-ups over the teachers, ``results.json``, ``report.md``;
- :mod:`spdrank.compare.plots`: quality vs latency, and stacked latency bars (PNG).

The measuring itself is :func:`spdrank.eval.evaluate.evaluate`: the benchmark only chooses the
rows and writes up what it returns.
"""
