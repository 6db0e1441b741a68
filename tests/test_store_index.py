"""The store's per-queue index (store/index.py) against a dict model: random inserts,
replaces and pops in the orders the store makes them (adds in seq order, acks mostly
FIFO, some out of order, re-inserts at recovery), every lookup compared. In process."""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest

from ackmq.store.index import DEAD, PENDING, QueueIndex


def _find_by_bisect(idx: QueueIndex, seq: int) -> int:
    """`_find` as it was before its O(1) cases: a bisect from the head."""
    i = bisect_left(idx.seqs, seq, idx.head)
    return i if i < len(idx.seqs) and idx.seqs[i] == seq else -1


@pytest.mark.parametrize("seed", range(20))
def test_the_index_agrees_with_a_dict(seed: int) -> None:
    rnd = random.Random(seed)
    idx, model = QueueIndex(), {}
    nxt = 1
    for _ in range(3000):
        op = rnd.random()
        if op < 0.45:  # a new message (buffered, then written)
            idx.insert(nxt, PENDING)
            model[nxt] = PENDING
            if rnd.random() < 0.8:
                assert idx.replace(nxt, PENDING, nxt << 8)
                model[nxt] = nxt << 8
            nxt += 1
        elif op < 0.85 and model:  # an ack: the oldest mostly, else any
            seq = min(model) if rnd.random() < 0.7 else rnd.choice(list(model))
            assert idx.pop(seq) == model.pop(seq)
        elif op < 0.9 and nxt > 1:  # recovery's insert of an older seq
            seq = rnd.randrange(1, nxt)
            if seq not in model:
                idx.insert(seq, seq << 8)
                model[seq] = seq << 8
        seq = rnd.randrange(0, nxt + 2)
        found, ref = idx._find(seq), _find_by_bisect(idx, seq)
        assert found == ref or (ref == -1 and idx.locs[found] == DEAD)  # dead either way
        assert idx.get(seq) == model.get(seq, DEAD)
        assert len(idx) == len(model)
    assert list(idx.items()) == sorted(model.items())
