"""Definitions (exchanges, queues, bindings), the epoch and queue ids: a small journal.

Definition changes are rare and must be durable when the call returns, so each one is
one checksummed record appended to `defs.log` and fdatasynced — in every mode,
`--no-fsync` included: that flag gives up messages, never the broker's own metadata.
On every open the log is read, the epoch bumped, and the whole state rewritten
compactly (write temp file, fsync, rename, fsync directory), so the journal never grows
without bound.

Each durable queue gets a queue id (qid) that is never reused (`next_qid` is kept even
when the highest queue is deleted): message records name the qid, so a queue deleted and
declared again cannot inherit the old incarnation's messages.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ackmq.broker.storage import BindingDef, CorruptStore, ExchangeDef, QueueDef

from . import fileio
from .format import DEF, FrameWriter, encode_small, file_header, iter_records, log, valid_length


def encode_value(v: Any) -> Any:
    """AMQP table values -> JSON, tagging what JSON cannot hold (bytes, Decimal, datetime)."""
    if isinstance(v, dict):
        return {"$m": [[k, encode_value(x)] for k, x in v.items()]}
    if isinstance(v, list | tuple):
        return [encode_value(x) for x in v]
    if isinstance(v, bytes | bytearray):
        return {"$b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, decimal.Decimal):
        return {"$d": str(v)}
    if isinstance(v, datetime.datetime):
        return {"$t": v.isoformat()}
    return v




def _dec(v: Any) -> Any:
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if isinstance(v, dict):
        if "$m" in v:
            return {k: _dec(x) for k, x in v["$m"]}
        if "$b" in v:
            return base64.b64decode(v["$b"])
        if "$d" in v:
            return decimal.Decimal(v["$d"])
        if "$t" in v:
            return datetime.datetime.fromisoformat(v["$t"])
    return v


def binding_key(b: BindingDef) -> tuple[str, str, str, str, str]:
    return (b.source, b.destination, b.destination_kind, b.routing_key,
            json.dumps(encode_value(b.arguments), sort_keys=True))


@dataclass
class DefsState:
    epoch: int = 0
    next_qid: int = 1
    exchanges: dict[str, ExchangeDef] = field(default_factory=dict)
    queues: dict[str, tuple[int, QueueDef]] = field(default_factory=dict)
    bindings: dict[tuple[str, str, str, str, str], BindingDef] = field(default_factory=dict)

    def apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "epoch":
            self.epoch = max(self.epoch, op["epoch"])
            self.next_qid = max(self.next_qid, op["next_qid"])
        elif kind == "exchange":
            x = ExchangeDef(**_dec(op["def"]))
            self.exchanges[x.name] = x
        elif kind == "del_exchange":
            self.exchanges.pop(op["name"], None)
        elif kind == "queue":
            q = QueueDef(**_dec(op["def"]))
            self.queues[q.name] = (op["qid"], q)
            self.next_qid = max(self.next_qid, op["qid"] + 1)
        elif kind == "del_queue":
            self.queues.pop(op["name"], None)
        elif kind == "binding":
            b = BindingDef(**_dec(op["def"]))
            self.bindings[binding_key(b)] = b
        elif kind == "del_binding":
            self.bindings.pop(binding_key(BindingDef(**_dec(op["def"]))), None)
        else:
            raise CorruptStore(f"unknown definition record {kind!r}")

    def snapshot(self) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = [
            {"op": "epoch", "epoch": self.epoch, "next_qid": self.next_qid}]
        ops += [{"op": "exchange", "def": encode_value(asdict(d))} for d in self.exchanges.values()]
        ops += [{"op": "queue", "qid": qid, "def": encode_value(asdict(d))}
                for qid, d in self.queues.values()]
        ops += [{"op": "binding", "def": encode_value(asdict(b))} for b in self.bindings.values()]
        return ops


class DefsLog:
    """Append-only, checksummed journal of definition operations (`defs.log`)."""

    NAME = "defs.log"

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.path = data_dir / self.NAME
        self.state = DefsState()
        self._fd = -1

    def load_and_bump(self) -> DefsState:
        """Read the journal (dropping a torn tail), bump the epoch, rewrite it compactly."""
        if self.path.exists():
            data = self.path.read_bytes()
            # each append was fdatasynced before the next: only the last can be torn
            end = valid_length(data, str(self.path), 0, newest=True, each_synced=True)
            if end < len(data):
                log.warning("%s: dropped torn tail at offset %d (%d bytes)",
                            self.path, end, len(data) - end)
            if end:
                for _, rec in iter_records(data, 16, end):
                    if rec[0] != DEF:
                        raise CorruptStore(f"{self.path}: unexpected record type {rec[0]}")
                    self.state.apply(json.loads(bytes(rec[1:])))
        self.state.epoch += 1
        self._rewrite()
        return self.state

    def _rewrite(self) -> None:
        fw = FrameWriter()
        for op in self.state.snapshot():
            fw.begin_record()
            encode_small(fw.out, bytes([DEF]) + json.dumps(op).encode())
        # durable before anything else happens: the epoch must never go backwards
        fileio.atomic_write(self.path, file_header(0) + fw.finish())
        if self._fd >= 0:
            fileio.close(self._fd)
        self._fd = fileio.open(self.path, os.O_WRONLY | os.O_APPEND)

    def append(self, op: dict[str, Any]) -> None:
        """Apply and make durable one operation (the caller waits for the fsync)."""
        fw = FrameWriter()
        fw.begin_record()
        encode_small(fw.out, bytes([DEF]) + json.dumps(op).encode())
        data = fw.finish()
        size = os.fstat(self._fd).st_size
        try:
            written = fileio.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
            fileio.fdatasync(self._fd)  # always, --no-fsync too
        except OSError:
            try:
                fileio.ftruncate(self._fd, size)
            except OSError:
                pass
            raise
        self.state.apply(op)

    def close(self) -> None:
        if self._fd >= 0:
            fileio.close(self._fd)
            self._fd = -1
