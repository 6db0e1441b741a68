"""The fsync histograms' buckets (/metrics): an observation lands where bisect_left puts it
(Prometheus's `le`: a value equal to a bound counts in that bound's bucket)."""

from __future__ import annotations

import random
from bisect import bisect_left

from ackmq.broker.stats import BATCH_BUCKETS, LATENCY_BUCKETS, Histogram


def test_observations_land_in_bisect_lefts_bucket() -> None:
    rnd = random.Random(7)
    for buckets in (LATENCY_BUCKETS, BATCH_BUCKETS):
        h = Histogram(buckets)
        want = [0] * (len(buckets) + 1)
        values: list[float] = [*buckets, 0, 0.0, 1e9, *(b * 1.0000001 for b in buckets)]
        values += [rnd.uniform(0, 20) for _ in range(500)] + [rnd.randrange(20000) for _ in range(500)]
        for v in values:
            h.observe(v, 2)
            want[bisect_left(buckets, v)] += 2
        assert h.counts == want
        assert h.count == 2 * len(values)
