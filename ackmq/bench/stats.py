"""Pure numbers: medians, percentiles, ratios and the A/B schedule (unit-tested, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """Median of the runs: robust to the one run the noisy neighbour spoiled."""
    if not values:
        raise ValueError("median of no values")
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (p in 0..100).

    Nearest rank, not interpolation: p99.9 of 1,000 samples is the 999th sample,
    a latency that really happened.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile out of range: {p}")
    rank = max(1, math.ceil(round(p * len(sorted_values) / 100.0, 9)))  # 99.9% of 1000 is 999
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is zero (nothing to compare against)."""
    if b == 0:
        return None
    return a / b


def verdict(r: float | None, better: str, a_name: str, b_name: str) -> str:
    """Say in words who won, so nobody has to remember which way a ratio points."""
    if r is None or r <= 0:
        return "not comparable"  # e.g. a memory delta lost in noise at tiny scale
    if abs(r - 1.0) < 0.02:
        return "same"
    a_wins = r < 1.0 if better == "lower" else r > 1.0
    factor = (1.0 / r) if r < 1.0 else r
    return f"{a_name if a_wins else b_name} {factor:.2f}x better"


def schedule(workloads: Sequence[str], brokers: Sequence[str], rounds: int) -> list[tuple[str, int, str]]:
    """(workload, round, broker) in run order: per workload A B A B ... for `rounds` rounds.

    Alternating the brokers run by run, rather than all of A then all of B, spreads
    machine drift (other load, thermal, page cache) evenly over both, so it cancels
    in the ratio of the medians.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    return [(w, r, b) for w in workloads for r in range(rounds) for b in brokers]
