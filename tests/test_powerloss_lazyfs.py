"""Power loss on a real file system that drops unsynced writes: `ackmq serve` on LazyFS,
kill -9 + clear-cache under confirm-each publishers (tools/robustness/powerloss.py; the
100-cycle runs are in docs/robustness.md). Skipped where LazyFS cannot be built."""

from __future__ import annotations

import pytest

# bounded: each cycle ends with a kill -9 and a restart; a torn cycle also remounts
# LazyFS (~20-40 s a cycle on a loaded 2-core machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lazyfs() -> None:
    from tools.robustness.powerloss import lazyfs_unavailable
    why = lazyfs_unavailable()
    if why:
        pytest.skip(why)


def test_P9_lazyfs_power_cuts_lose_nothing_confirmed(lazyfs: None) -> None:
    from tools.robustness.powerloss import run
    rep = run(cycles=6, seed=7)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 6
    assert rep.confirmed > 0
    assert rep.lost == 0, rep.lines
    assert rep.tracebacks == []


def test_P9_lazyfs_no_fsync_loses_messages_but_always_comes_back(lazyfs: None) -> None:
    """--no-fsync: confirmed messages are lost at a power cut (LazyFS shows it), but the
    broker's metadata is synced, so it starts again every time (issue 23)."""
    from tools.robustness.powerloss import run
    rep = run(cycles=6, fsync=False, seed=7)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 6
    assert rep.lost > 0, rep.lines  # the run can see what --no-fsync gives up
    assert rep.tracebacks == []


def test_P9_lazyfs_torn_write_loses_nothing_confirmed(lazyfs: None) -> None:
    """LazyFS's torn-op fault: the next write to the active segment is split in three,
    parts 1 and 3 persisted, LazyFS dies (all else unsynced is gone): the torn frame is
    cut at recovery, nothing confirmed is lost, the broker starts."""
    from tools.robustness.powerloss import run
    rep = run(cycles=3, seed=11, torn=True, stop_untorn=True)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 3 or rep.tears < rep.cycles
    assert rep.confirmed > 0
    assert rep.lost == 0, rep.lines
    assert rep.tracebacks == []
    if rep.tears == 0:  # the cycles above were plain power cuts then, still checked
        pytest.skip("LazyFS did not take its torn-op fault in any cycle (seen on loaded "
                    "machines: 'no write to tear within 10 s'); torn writes are covered "
                    "by the in-process simulator (tests/test_store_crashsim.py): "
                    + "; ".join(rep.lines))


def test_L2_lazyfs_power_cuts_with_delayed_messages_pending(lazyfs: None) -> None:
    """Confirm-each publishers through a durable x-delayed-message exchange (x-delay up
    to 3 s), kill -9 + clear-cache while messages are pending and firing: after each
    restart every confirmed delayed message arrives once, none before its due time."""
    from tools.robustness.powerloss import run
    rep = run(cycles=3, seed=5, delayed_ms=3000)
    assert rep.refused == 0, rep.lines
    assert rep.cycles == 3
    assert rep.confirmed > 0
    assert (rep.lost, rep.duplicates, rep.early) == (0, 0, 0), rep.lines
    assert rep.tracebacks == []
