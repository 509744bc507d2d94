"""The latency histogram's buckets: the first bound an observation is not above."""

from __future__ import annotations

import math

import pytest

from turnloom.runtime._counters import LATENCY_BOUNDS, Histogram


def _linear(seconds: float) -> int:
    """The oracle: the first bound ``seconds`` is at most, else the ``+Inf`` bucket."""
    for index, bound in enumerate(LATENCY_BOUNDS):
        if seconds <= bound:
            return index
    return len(LATENCY_BOUNDS)


@pytest.mark.parametrize(
    "seconds",
    [
        -1.0,
        0.0,
        *LATENCY_BOUNDS,
        *(math.nextafter(b, math.inf) for b in LATENCY_BOUNDS),
        *(math.nextafter(b, -math.inf) for b in LATENCY_BOUNDS),
        1e9,
        math.inf,
        -math.inf,
        math.nan,
    ],
)
def test_an_observation_lands_in_the_first_bucket_whose_bound_it_is_not_above(
    seconds: float,
) -> None:
    """Invariant: a bound is inclusive (an observation equal to it counts in its
    bucket), one just above goes to the next, and what no bound holds (NaN, more
    than the last bound) counts in ``+Inf``; the sum adds the observation."""
    histogram = Histogram()
    histogram.observe(seconds)
    expected = [0] * (len(LATENCY_BOUNDS) + 1)
    expected[_linear(seconds)] = 1
    assert histogram.counts == expected
    assert histogram.sum == seconds or (math.isnan(seconds) and math.isnan(histogram.sum))


def test_bucket_of_a_bound_and_of_nan_exactly() -> None:
    """Invariant: exact buckets for a few values (bounds ascend, ``+Inf`` last)."""
    histogram = Histogram()
    for seconds in (0.0005, 0.0006, math.nan, 0.0):
        histogram.observe(seconds)
    assert histogram.counts[:3] == [2, 1, 0]
    assert histogram.counts[-1] == 1
    assert sum(histogram.counts) == 4
