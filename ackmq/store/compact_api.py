"""The compactor's narrow view of the store (compact.py calls only these, from its own
thread): which segments are closed, which ADD records are still needed, and the atomic
switch of the index to a compacted file."""

from __future__ import annotations

from pathlib import Path

from . import fileio
from .index import DEAD
from .state import SegInfo, seg_name
from .writer import WriterMixin


class CompactionMixin(WriterMixin):
    def wait_compaction(self) -> bool:
        """Block until the next compaction round is due; False once the store closes."""
        self._compact_wake.wait(self.compact_interval)
        self._compact_wake.clear()
        return not self._closing

    def closed_segments(self) -> list[tuple[int, int, float]]:
        """(segment, size, estimated live bytes) of every segment no longer written to."""
        with self._lock:
            closed = sorted(s for s in self._segs if s < self._active)
            return [(s, self._segs[s].size, self._segs[s].live_bytes()) for s in closed]

    def segment_path(self, s: int) -> Path:
        with self._lock:
            return self._paths[s]

    def live_adds(self, cands: list[tuple[int, int, int, int, int]]
                  ) -> list[tuple[int, int, int, int, int]]:
        """The ADD records among `cands` (qid, seq, position, ...) still needed on disk:
        live in the index, or removed by a REMOVE not written yet."""
        with self._lock:
            return [c for c in cands if self._is_live(c[0], c[1], c[2])]

    def _is_live(self, qid: int, seq: int, pos: int) -> bool:
        idx = self._index.get(qid)
        if idx is not None and idx.get(seq) == pos and pos != DEAD:
            return True
        return self._unwritten_removes.get((qid, seq)) == pos

    def sync_written(self) -> None:
        """fdatasync every record written so far. `live_adds` counts a REMOVE as done once
        written; before the prefix holding the ADD it removed can go, that REMOVE must be
        on disk, and with it the rest of its batch: for a moved message (a delayed one
        firing, a dead-letter) the ADD of the new copy. Else a power cut keeps neither."""
        if not self.fsync:
            return
        with self._wlock:  # a write in progress has finished and counted its generation
            gen = self._wstate[1]
        err = self._sync_to(gen)
        if err is not None:
            raise err

    def notes_in(self, prefix: list[int]) -> list[bytes]:
        """The live notes (notes.py) whose record is in `prefix`: compaction copies them."""
        segs = set(prefix)
        with self._lock:
            return [k for k, s in self._notes.items() if s in segs]

    def replace_prefix(self, prefix: list[int],
                       new: tuple[int, Path, int, list[tuple[int, int, int, int]], int] | None,
                       notes: list[bytes] | None = None) -> None:
        """Switch the index to the compacted file `new` (k, path, size, moved (qid, seq,
        old position, new position), bytes copied), if any, then delete the prefix;
        `notes` were copied into it too."""
        with self._lock:
            self._forget_read_ahead()
            if new is not None:
                k, path, size, moved, copied = new
                segs = set(prefix)
                for key in notes or ():
                    if self._notes.get(key) in segs:  # not forgotten or put again since
                        self._notes[key] = k
                info = SegInfo(size=size, adds=len(moved), add_bytes=copied)
                for qid, seq, old, pos in moved:
                    idx = self._index.get(qid)
                    if idx is not None and idx.replace(seq, old, pos):
                        info.live += 1
                    elif self._unwritten_removes.get((qid, seq)) == old:
                        self._unwritten_removes[(qid, seq)] = pos
            for s in prefix:
                fd = self._rfds.pop(s, None)
                if fd is not None:
                    fileio.close(fd)
                self._segs.pop(s, None)
                self._paths.pop(s, None)
            if new is not None:
                self._segs[k] = info
                self._paths[k] = path
        for s in prefix:  # oldest first: a crash part way leaves a consistent shorter log
            fileio.unlink(self.dir / seg_name(s), missing_ok=True)
        fileio.fsync_dir(self.dir)
        if new is not None:
            with self._lock:
                fileio.replace(new[1], self.dir / seg_name(new[0]))
                self._paths[new[0]] = self.dir / seg_name(new[0])
            fileio.fsync_dir(self.dir)
