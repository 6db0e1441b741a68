"""In-process tests of `ReadyList` (broker/readylist.py), a queue's ready messages:
seq order, requeue back to the original position (SPEC D6), the heap of requeued
entries, priorities, and the cold tail on a spill (deep queues). No sockets; the wire
behaviour stays covered by tests/test_queues.py and tests/test_paging.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackmq.broker.message import Message
from ackmq.broker.queue_type import Queue, QueueEntry
from ackmq.broker.readylist import HOT_FLOOR, REFILL, HotBudget, ReadyList


class MemSpill:
    """The spill's interface (ackmq.store.spill.Spill), in memory."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.next = 0
        self.fail = False

    def put(self, record: bytes) -> int:
        if self.fail:
            raise OSError("spill full")
        self.next += 1
        self.records[self.next] = record
        return self.next

    def get(self, loc: int) -> bytes:
        return self.records[loc]

    def get_many(self, locs: list[int]) -> list[bytes]:
        return [self.records[loc] for loc in locs]

    def release(self, loc: int) -> None:
        del self.records[loc]


class _Host:
    """The vhost as the queue-type seam sees it: a name."""

    name = "/"


OWNER = Queue(_Host(), "q")  # entries belong to a queue (the compiled QueueEntry checks it)


def entry(seq: int, priority: int = 0) -> QueueEntry:
    props = b"\x00\x00" if not priority else b"\x08\x00" + bytes([priority])
    return QueueEntry(Message("", "q", props, b"m%d" % seq), seq, OWNER)


def drain(rl: ReadyList) -> list[int]:
    out = []
    while len(rl):
        assert rl.peek() is not None
        head = rl.peek().seq
        e = rl.pop()
        assert e.seq == head  # peek and pop agree
        out.append(e.seq)
    assert rl.peek() is None
    return out


def test_d6_new_messages_come_out_in_seq_order():
    rl = ReadyList()
    for s in range(1, 6):
        rl.append(entry(s))
    assert drain(rl) == [1, 2, 3, 4, 5]


def test_d6_requeued_message_goes_back_to_its_original_position():
    rl = ReadyList()
    for s in range(1, 6):
        rl.append(entry(s))
    first, second = rl.pop(), rl.pop()
    rl.append(entry(6))
    rl.requeue(second)
    rl.requeue(first)  # requeued in reverse: the heap puts them back in order
    assert drain(rl) == [1, 2, 3, 4, 5, 6]


def test_d6_requeued_before_later_publishes_after_earlier_ones():
    rl = ReadyList()
    for s in (1, 2, 3):
        rl.append(entry(s))
    e1, e2 = rl.pop(), rl.pop()
    rl.requeue(e2)
    assert rl.peek().seq == 2
    rl.requeue(e1)
    assert rl.peek().seq == 1


def test_count_and_bytes_follow_append_pop_requeue():
    rl = ReadyList()
    for s in range(1, 4):
        rl.append(entry(s))
    assert len(rl) == 3 and rl.bytes == 6
    e = rl.pop()
    assert len(rl) == 2 and rl.bytes == 4
    rl.requeue(e)
    assert len(rl) == 3 and rl.bytes == 6


def test_priorities_highest_first_seq_order_within_a_level():
    rl = ReadyList(max_priority=3)
    for s, p in [(1, 0), (2, 3), (3, 1), (4, 3), (5, 0), (6, 9)]:  # 9 counts as 3
        rl.append(entry(s, p))
    assert drain(rl) == [2, 4, 6, 3, 1, 5]


def test_drop_head_takes_the_oldest_of_the_lowest_priority():
    rl = ReadyList(max_priority=2)
    for s, p in [(1, 2), (2, 0), (3, 0)]:
        rl.append(entry(s, p))
    assert rl.pop_oldest().seq == 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pub", "pop", "requeue"]), st.integers(0, 9)),
                max_size=80), st.integers(0, 3))
def test_d6_any_history_pops_the_smallest_ready_seq(ops, max_priority):
    """Against a model (a sorted set per priority): every pop/peek gives the smallest
    ready seq of the highest non-empty priority, whatever the requeues."""
    rl = ReadyList(max_priority=max_priority)
    ready: dict[int, int] = {}  # seq -> level
    taken: list[QueueEntry] = []
    seq = 0
    for op, arg in ops:
        if op == "pub":
            seq += 1
            e = entry(seq, arg % 4)
            rl.append(e)
            ready[seq] = min(e.priority, max_priority)
        elif op == "pop" and ready:
            top = max(ready.values())
            want = min(s for s, lv in ready.items() if lv == top)
            assert rl.peek().seq == want
            e = rl.pop()
            assert e.seq == want
            del ready[want]
            taken.append(e)
        elif op == "requeue" and taken:
            e = taken.pop(arg % len(taken))
            rl.requeue(e)
            ready[e.seq] = min(e.priority, max_priority)
        assert len(rl) == len(ready)
    assert sorted(e.seq for e in rl) == sorted(ready)


# ---- deep queues: the cold tail on the spill ----------------------------------------

def test_cold_tail_past_hot_max_keeps_order_and_reads_back():
    spill = MemSpill()
    rl = ReadyList(spill=spill, owner=OWNER, hot_max=10)
    n = 10 + 2 * REFILL + 7
    for s in range(1, n + 1):
        rl.append(entry(s))
    assert rl.spilled == n - 10
    assert len(spill.records) == n - 10
    assert drain(rl) == list(range(1, n + 1))
    assert spill.records == {}  # every spilled record released once read back
    assert rl.bytes == 0


def test_cold_tail_requeue_of_a_read_back_entry_goes_before_the_rest():
    spill = MemSpill()
    rl = ReadyList(spill=spill, owner=OWNER, hot_max=2)
    for s in range(1, 8):
        rl.append(entry(s))
    got = [rl.pop() for _ in range(4)]  # 1, 2 hot; 3, 4 read back from the spill
    assert [e.seq for e in got] == [1, 2, 3, 4]
    rl.requeue(got[3])
    rl.requeue(got[1])
    assert drain(rl) == [2, 4, 5, 6, 7]


def test_cold_tail_once_the_budget_is_used_up():
    spill = MemSpill()
    budget = HotBudget(limit=0)
    rl = ReadyList(spill=spill, owner=OWNER, budget=budget)
    n = HOT_FLOOR + 5
    for s in range(1, n + 1):
        rl.append(entry(s))
    assert rl.spilled == 5  # the floor stays in memory, the rest goes to the spill
    assert drain(rl) == list(range(1, n + 1))
    assert budget.used == 0


def test_spill_failure_keeps_the_message_in_memory_after_the_spilled_ones():
    spill = MemSpill()
    rl = ReadyList(spill=spill, owner=OWNER, hot_max=2)
    for s in range(1, 5):
        rl.append(entry(s))
    spill.fail = True
    rl.append(entry(5))
    assert drain(rl) == [1, 2, 3, 4, 5]


def test_page_out_keeps_order():
    spill = MemSpill()
    rl = ReadyList(spill=spill, owner=OWNER, hot_max=3)
    for s in range(1, 7):
        rl.append(entry(s))
    e = rl.pop()
    rl.requeue(e)  # requeued entries stay in memory
    assert rl.page_out() == 2  # 2, 3 were fresh
    assert drain(rl) == [1, 2, 3, 4, 5, 6]


def test_clear_returns_every_entry_spilled_ones_too():
    spill = MemSpill()
    rl = ReadyList(spill=spill, owner=OWNER, hot_max=2)
    for s in range(1, 6):
        rl.append(entry(s))
    assert sorted(e.seq for e in rl.clear()) == [1, 2, 3, 4, 5]
    assert len(rl) == 0 and spill.records == {}
