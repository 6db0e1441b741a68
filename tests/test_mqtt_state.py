"""In-process: the retained messages' Message Expiry Interval is kept on disk as a wall
clock deadline (N5, [MQTT-3.3.2-5]): it holds across a restart, and an expired message is
gone from memory and from `mqtt-retained.log` once a subscription meets it."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from ackmq.server.mqtt.state import MQTTState


def _open(root: Path) -> MQTTState:
    st = MQTTState(SimpleNamespace(config=SimpleNamespace(data_dir=root, fsync=True)))  # type: ignore[arg-type]
    st.open()
    return st


def test_N5_retained_expiry_is_kept_across_a_restart_and_expired_ones_go(tmp_path: Path) -> None:
    st = _open(tmp_path)
    st.retain("/", "a/old", 1, b"\x00\x00", b"x", expiry=1)
    st.retain("/", "a/new", 1, b"\x00\x00", b"y", expiry=600)
    st.retain("/", "a/never", 0, b"\x00\x00", b"z")
    st.sync()
    st.close()
    st = _open(tmp_path)
    now = time.time()
    left = {r.topic: r.left_ms(now) for r in st.retained_for("/", "a/#", now)}
    assert left["a/never"] is None and 0 < left["a/old"] <= 1000  # type: ignore[operator]
    assert 590_000 < left["a/new"] <= 600_000  # type: ignore[operator]
    later = now + 2
    assert sorted(r.topic for r in st.retained_for("/", "a/#", later)) == ["a/never", "a/new"]
    st.sync()
    st.close()
    st = _open(tmp_path)
    assert sorted(st.retained["/"]) == ["a/never", "a/new"]
    st.close()
