"""``spdrank bench``: the paper's tables side by side, from one process on the same slates.

- :mod:`spdrank.bench.decoders`: one SPD checkpoint under every decoder, one forward per slate;
- :mod:`spdrank.bench.latency`: the latency decomposition (Table 5) at several slate sizes;
- :mod:`spdrank.bench.report`: speed-ups over the teachers, ``results.json``, ``report.md``;
- :mod:`spdrank.bench.plots`: quality vs latency, and stacked latency bars (PNG).

The measuring itself is :func:`spdrank.evaluate.evaluate`: the benchmark only chooses the
rows and writes up what it returns.
"""
