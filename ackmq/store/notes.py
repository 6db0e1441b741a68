"""Notes: keys a front end writes into the message log itself, in the same frame as the
messages buffered beside them, so that one fdatasync makes both durable and a power cut
keeps both or neither (a frame is all or nothing, recovery keeps a prefix of frames).

MQTT's QoS 2 packet ids received and not yet released are notes (docs/mqtt.md, "QoS 2
across a power cut"): a note is put in the loop turn that routed its message, so it
shares that message's frame; a separate file synced after the message would leave a
window in which the message survives and its id does not.

A note lives until forgotten; compaction copies the live notes of the prefix it
replaces (compact.py), so a note outlives the segment that first held it."""

from __future__ import annotations

from .format import NOTE_FORGET, NOTE_PUT
from .writer import WriterMixin


class NotesMixin(WriterMixin):
    def note(self, key: bytes) -> None:
        """Put `key` in the next batch (durable with the batch's messages)."""
        with self._lock:
            self._pending.notes.append((NOTE_PUT, key))
            self._notes[key] = -1

    def forget(self, key: bytes) -> None:
        """Drop `key`, durably with the next batch (commit it to wait for that)."""
        with self._lock:
            if self._notes.pop(key, None) is not None:
                self._pending.notes.append((NOTE_FORGET, key))

    def notes(self) -> list[bytes]:
        """The live notes (after `open`: those recovered)."""
        with self._lock:
            return list(self._notes)
