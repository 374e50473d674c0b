"""Paired differences over slates: pairing by slate index, skipped undefined slates, and the
percentile bootstrap interval on cases worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spdrank.eval.evaluate import RankerResult, SlateRecord, evaluate
from spdrank.eval.metrics import SlateMetrics
from spdrank.eval.paired import bootstrap_interval, compare, paired_difference, paired_values
from tests.helpers import EVAL, Fixed


def result(name: str, values: list[float | None], metric: str = "AUC") -> RankerResult:
    """A ranker's records with ``values[i]`` as its metric on slate i."""
    records = [
        SlateRecord(index=i, qid=f"q{i}", latency_ms=1.0, decode_passes=1,
                    metrics=SlateMetrics(valid=True, values={metric: v}))
        for i, v in enumerate(values)
    ]
    return RankerResult(name, records)


def test_a_constant_difference_gives_a_zero_width_interval_at_that_value():
    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 0.5, 50).tolist()
    d = paired_difference(result("row", [v + 0.25 for v in ref]), result("ref", ref), "AUC")
    assert d.n == 50
    assert d.low == d.high  # every resample has the same mean
    assert d.mean == pytest.approx(0.25) and d.low == pytest.approx(0.25)
    assert d.excludes_zero


def test_identical_rows_differ_by_zero_plus_minus_zero():
    values = [0.1, 0.9, 0.5, 0.3]
    d = paired_difference(result("row", values), result("ref", values), "AUC")
    assert (d.n, d.mean, d.low, d.high) == (4, 0.0, 0.0, 0.0)
    assert not d.excludes_zero


def test_two_slates_the_bootstrap_by_hand():
    # Differences 0 and 1: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% points of 2,000 resampled means are 0 and 1.
    d = paired_difference(result("row", [0.0, 1.0]), result("ref", [0.0, 0.0]), "AUC")
    assert (d.n, d.mean, d.low, d.high) == (2, 0.5, 0.0, 1.0)


def test_a_known_shift_is_recovered_with_the_width_of_a_t_interval():
    rng = np.random.default_rng(1)
    n, shift, sd = 400, 0.05, 0.2
    ref = rng.uniform(0.3, 0.7, n)
    row = ref + shift + rng.normal(0, sd, n)
    d = paired_difference(result("row", row.tolist()), result("ref", ref.tolist()), "AUC")
    diffs = row - ref
    half_t = 1.966 * diffs.std(ddof=1) / math.sqrt(n)  # t quantile, 399 degrees of freedom
    assert d.mean == pytest.approx(diffs.mean())
    assert d.low < shift < d.high
    assert d.low == pytest.approx(d.mean - half_t, abs=0.15 * half_t)
    assert d.high == pytest.approx(d.mean + half_t, abs=0.15 * half_t)
    assert d.excludes_zero  # 0.05 is about five standard errors away


def test_slates_undefined_for_either_row_are_skipped_pairwise():
    ref = result("ref", [0.5, None, 0.7, 0.2, float("nan")])
    row = result("row", [0.6, 0.9, None, 0.4, 0.3])
    row.records.reverse()  # pairing is by slate index, not by position
    assert paired_values(row, ref, "AUC").tolist() == pytest.approx([0.1, 0.2])
    d = paired_difference(row, ref, "AUC")
    assert d.n == 2 and d.mean == pytest.approx(0.15)
    one = paired_difference(result("row", [0.6, None]), result("ref", [0.5, 0.5]), "AUC")
    assert one.n == 1 and one.mean == pytest.approx(0.1) and one.low is one.high is None
    none = paired_difference(result("row", [None]), result("ref", [0.5]), "AUC")
    assert (none.n, none.mean, none.low, none.high) == (0, None, None, None)


def test_the_interval_is_seeded_and_checks_its_arguments():
    values = np.random.default_rng(2).normal(0, 1, 30)
    assert bootstrap_interval(values, seed=3) == bootstrap_interval(values, seed=3)
    assert bootstrap_interval(values, seed=3) != bootstrap_interval(values, seed=4)
    narrow = bootstrap_interval(values, level=0.5)
    wide = bootstrap_interval(values, level=0.99)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval(values, resamples=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval(values, level=1.0)


def test_compare_every_row_against_the_reference():
    rankers = [
        Fixed("identity", lambda s: s.docids),
        Fixed("reverse", lambda s: s.docids[::-1]),
        Fixed("teacher", lambda s: s.teacher or s.docids),
    ]
    results = evaluate(rankers, EVAL, warmup=0)
    paired = compare(results, "identity", ["MRR", "tau"], resamples=200)
    assert list(paired.rows) == ["reverse", "teacher"]
    # e3 has every candidate clicked: MRR pairs e1 and e2 only; tau needs a teacher (e1, e2)
    mrr = paired.rows["teacher"]["MRR"]
    assert mrr.n == 2 and mrr.mean == pytest.approx(((1 - 1 / 3) + 0) / 2)
    assert paired.rows["teacher"]["tau"].n == 2
    # the mean paired difference is the difference of the means when every slate pairs
    rev, ident = results["reverse"].summary(), results["identity"].summary()
    assert paired.rows["reverse"]["MRR"].mean == pytest.approx(
        rev["MRR"].mean - ident["MRR"].mean
    )
    d = paired.to_dict()
    assert d["reference"] == "identity" and d["resamples"] == 200 and d["level"] == 0.95
    assert d["rows"]["teacher"]["MRR"] == mrr.to_dict()
    with pytest.raises(ValueError, match="no row named 'nobody'"):
        compare(results, "nobody", ["MRR"])


def test_a_difference_reads_as_a_table_cell():
    from spdrank.eval.paired import PairedDifference

    assert PairedDifference(5, 0.1234, -0.01, 0.25).text() == "+0.123 [-0.010, +0.250]"
    assert PairedDifference(1, -0.5, None, None).text(digits=2) == "-0.50"
    assert PairedDifference(0, None, None, None).text(missing="—") == "—"
