"""In-process tests of `ConfirmTracker` (broker/confirms.py), the model behind publisher
confirms (SPEC P3, P4, P6, P7): which settled numbers become one `multiple=true` ack,
which go singly, and nacks among acks. No sockets: the rules, checked where they live.
The wire-level behaviour stays covered by tests/test_confirms.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackmq.broker.confirms import ConfirmTracker


def answered(frames: list[tuple[bool, int, bool]], settled_before: set[int],
             published: int) -> dict[int, bool]:
    """What a client makes of `frames` (P4): seq -> acked?, each seq answered once.
    A `multiple` frame settles every number up to its tag not settled before."""
    out: dict[int, bool] = {}
    done = set(settled_before)
    for ack, tag, multiple in frames:
        seqs = [s for s in range(1, tag + 1) if s not in done] if multiple else [tag]
        for s in seqs:
            assert 1 <= s <= published, f"frame {(ack, tag, multiple)} names unpublished {s}"
            assert s not in done, f"{s} answered twice ({(ack, tag, multiple)})"
            done.add(s)
            out[s] = ack
    return out


def test_p3_numbers_start_at_one_and_count_every_publish():
    t = ConfirmTracker()
    assert [t.publish() for _ in range(4)] == [1, 2, 3, 4]


def test_p4_one_ack_goes_single():
    t = ConfirmTracker()
    t.ack(t.publish())
    assert t.drain() == [(True, 1, False)]
    assert not t.dirty


def test_p4_consecutive_acks_coalesce_into_one_multiple():
    t = ConfirmTracker()
    seqs = [t.publish() for _ in range(5)]
    for s in seqs:
        t.ack(s)
    assert t.drain() == [(True, 5, True)]


def test_p4_next_turn_single_ack_after_a_multiple_is_not_multiple():
    t = ConfirmTracker()
    for _ in range(3):
        t.ack(t.publish())
    assert t.drain() == [(True, 3, True)]
    t.ack(t.publish())
    assert t.drain() == [(True, 4, False)]


def test_p4_multiple_stops_below_the_oldest_outstanding():
    """1 and 2 settled, 3 waits for the fsync, 4 settled: a multiple ack may cover 1..2
    only; 4 goes singly, never under a multiple that would also settle 3."""
    t = ConfirmTracker()
    s = [t.publish() for _ in range(4)]
    t.wait(s[2])
    for x in (s[0], s[1], s[3]):
        t.ack(x)
    assert t.drain() == [(True, 2, True), (True, 4, False)]
    assert t.outstanding == 1


def test_p7_out_of_order_fsync_then_catches_up():
    """P7: 2 fsynced before 1; the client gets 2 alone, then 1 alone, never a multiple
    that re-settles 2."""
    t = ConfirmTracker()
    a, b = t.publish(), t.publish()
    t.wait(a)
    t.wait(b)
    t.ack(b)
    assert t.drain() == [(True, 2, False)]
    t.ack(a)
    frames = t.drain()
    assert answered(frames, {2}, 2) == {1: True}


def test_p6_nack_among_acks_is_never_covered_by_a_multiple_ack():
    t = ConfirmTracker()
    s = [t.publish() for _ in range(4)]
    t.ack(s[0])
    t.nack(s[1])
    t.ack(s[2])
    t.ack(s[3])
    frames = t.drain()
    assert (False, 2, False) in frames
    assert answered(frames, set(), 4) == {1: True, 2: False, 3: True, 4: True}


def test_p6_nack_alone():
    t = ConfirmTracker()
    t.nack(t.publish())
    assert t.drain() == [(False, 1, False)]


# ---- the property: whatever the settle order, turns and nacks, P4 holds -------------

@st.composite
def histories(draw):
    """Publishes, each either settled at once or waiting for a commit; then the waiting
    ones settle (ack or nack) in any order, with drains (event-loop turns) between."""
    n = draw(st.integers(1, 30))
    waits = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    nacks = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    drains = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return n, waits, nacks, order, drains


@settings(max_examples=300, deadline=None)
@given(histories())
def test_p4_p6_p7_every_publish_answered_exactly_once_as_settled(h):
    n, waits, nacks, order, drains = h
    t = ConfirmTracker()
    frames: list[tuple[bool, int, bool]] = []
    expect: dict[int, bool] = {}
    seqs = []
    for i in range(n):
        s = t.publish()
        seqs.append(s)
        if waits[i]:
            t.wait(s)
        else:
            (t.nack if nacks[i] else t.ack)(s)
            expect[s] = not nacks[i]
    for i, k in enumerate(order):
        if waits[k]:
            (t.nack if nacks[k] else t.ack)(seqs[k])
            expect[seqs[k]] = not nacks[k]
        if drains[i]:
            frames += t.drain()
    frames += t.drain()
    assert not t.dirty and t.outstanding == 0
    assert answered(frames, set(), n) == expect


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40))
def test_p4_a_settled_run_in_one_turn_is_one_frame(n):
    """Under load (P4 "should coalesce"): n publishes settled in one turn, none
    outstanding, no nacks: one frame."""
    t = ConfirmTracker()
    for _ in range(n):
        t.wait(t.publish())
    for s in range(n, 0, -1):  # fsynced in reverse order, still one turn
        t.ack(s)
    assert t.drain() == [(True, n, True)]


def test_P1_take_confirmed_settles_one_or_everything_up_to_the_tag() -> None:
    """What a front end owed per sequence number, taken by a confirm: one tag, or (as
    `multiple`) every number up to it, in publish order; a value may be None."""
    from collections import OrderedDict

    from ackmq.broker.confirms import take_confirmed
    owed: OrderedDict[int, str | None] = OrderedDict([(1, "a"), (2, None), (4, "d"), (7, "g")])
    assert take_confirmed(owed, 2, False) == [None]
    assert take_confirmed(owed, 3, False) == []
    assert take_confirmed(owed, 5, True) == ["a", "d"]
    assert list(owed) == [7]
    assert take_confirmed(owed, 9, True) == ["g"] and not owed


def test_P1_take_settled_keeps_each_sequence_number_with_what_was_owed() -> None:
    """The pairs form (AMQP 1.0 sessions coalesce dispositions by number, the bench
    counts them): the same numbers as take_confirmed, each with its value."""
    from collections import OrderedDict

    from ackmq.broker.confirms import take_settled
    owed: OrderedDict[int, str] = OrderedDict([(1, "a"), (3, "c"), (4, "d"), (8, "h")])
    assert take_settled(owed, 3, False) == [(3, "c")]
    assert take_settled(owed, 2, False) == []
    assert take_settled(owed, 4, True) == [(1, "a"), (4, "d")]
    assert take_settled(owed, 5, True) == [] and list(owed) == [8]
