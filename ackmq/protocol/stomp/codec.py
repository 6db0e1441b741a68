"""Sans-IO STOMP 1.0 / 1.1 / 1.2 codec: bytes in, frames out; frames in, bytes out.

The rules this module keeps (stated here, as h11 states its own, so the server and the
tests can rely on them):

1. No I/O. `Decoder.feed(data)` takes whatever bytes the socket produced, in any split,
   and returns the events complete so far, in wire order: `Frame` and `HeartBeat`.
   How TCP split the bytes never changes the result.
2. A frame is: command EOL, header lines each ending in EOL, an empty line, the body,
   NUL. EOL is LF or CR LF in every version (1.2 wrote CR LF down; 1.0 and 1.1 clients
   send it too). Between frames any number of EOLs may come: each is one `HeartBeat`
   event (STOMP 1.1+ heart-beating). NULs between frames are skipped, as RabbitMQ does.
3. Escaping of header names and values depends on the negotiated version and the
   command: 1.0 none at all; 1.1 `\\n` `\\c` `\\\\` (and 1.2's `\\r`, as RabbitMQ
   accepts it); 1.2 `\\r` `\\n` `\\c` `\\\\`. Any other escape, or a backslash at the
   end, is an error. CONNECT, STOMP and CONNECTED are never escaped (1.2 spec: for
   compatibility with 1.0). The version is only known once the server has answered
   CONNECT, so after a CONNECT/STOMP frame the decoder stops and keeps the rest of the
   bytes until `negotiated(version)` is called; then `feed(b"")` goes on. A client that
   pipelines CONNECT and SUBSCRIBE in one packet is parsed with the right escaping.
4. Repeated headers: the first one wins (1.2 spec); later ones are dropped.
5. Body: with a `content-length` header (any command) exactly that many octets follow,
   then a NUL, or it is an error ("body longer than content-length"). Without one, the
   body runs to the first NUL.
6. Limits, each with its own error text: a command or header line longer than
   `max_line` octets, more than `max_headers` header lines, a body longer than
   `max_body` (declared or seen so far). Buffered bytes stay below about
   `max_headers * max_line + max_body`, whatever the peer sends.
7. Header names and values must be UTF-8 (the spec's encoding). Names may not be empty;
   a header line must contain a colon. Values may contain unescaped colons (after the
   first), as RabbitMQ and ActiveMQ accept them.
8. Errors raise `StompError(message, detail)`: `message` is a short name for the ERROR
   frame's `message` header, `detail` a sentence for its body. Frames decoded ahead of
   the bad one in the same `feed` are in `StompError.frames`: the server handles them
   first, so what counts never depends on TCP's split. After an error the decoder is
   dead: every later `feed` raises the same error.
9. The encoder (`encode_frame`) escapes per version and command as in 3, adds
   `content-length` when the body is not empty (as RabbitMQ does), and ends every frame
   with NUL LF (RabbitMQ's trailing LF: it doubles as a heart-beat).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

NUL = 0
LF = 10
CR = 13
VERSIONS = ("1.0", "1.1", "1.2")
UNESCAPED = frozenset(("CONNECT", "STOMP", "CONNECTED"))

MAX_LINE = 10 * 1024      # as ActiveMQ's default maximum header length
MAX_HEADERS = 1000        # as ActiveMQ's default maximum number of headers
MAX_BODY = 128 * 1024 * 1024  # the broker's max message size (RabbitMQ's 128 MiB)
BLOCK_MAX = 64 * 1024  # a header block longer than this is read line by line


class StompError(Exception):
    """Bad input: `message` names the problem (ERROR's `message` header), `detail`
    explains it (ERROR's body). `frames`: good frames decoded before it in one feed."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(f"{message}: {detail}")
        self.message = message
        self.detail = detail
        self.frames: list[Frame | HeartBeat] = []


@dataclass(slots=True)
class Frame:
    """One STOMP frame; `headers` keeps the first value of each name, in wire order."""

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, command: str, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> None:
        self.command, self.body = command, body
        self.headers = {} if headers is None else headers


@dataclass(slots=True)
class HeartBeat:
    """One or more EOLs between frames."""


_HEARTBEAT = HeartBeat()

# -- escaping -----------------------------------------------------------------------

# 1.1 and 1.2 alike: 1.1 has no \\r, but RabbitMQ accepts it there too
_UNESCAPE = {ord("n"): "\n", ord("c"): ":", ord("\\"): "\\", ord("r"): "\r"}
_ESCAPE_RE_11 = re.compile(r"[\\:\n\r]")
_ESCAPES = {"\\": "\\\\", ":": "\\c", "\n": "\\n", "\r": "\\r"}


def _unescape(raw: bytes, table: dict[int, str], what: str) -> str:
    """Header bytes with their escapes resolved; StompError on a bad sequence."""
    out: list[str] = []
    i = 0
    n = len(raw)
    while i < n:
        j = raw.find(b"\\", i)
        if j < 0:
            out.append(_utf8(raw[i:], what))
            break
        out.append(_utf8(raw[i:j], what))
        if j + 1 >= n:
            raise StompError("Bad escape", f"{what} ends with a lone backslash")
        ch = table.get(raw[j + 1])
        if ch is None:
            seq = raw[j:j + 2].decode("latin-1")
            raise StompError("Bad escape", f"undefined escape sequence {seq!r} in {what}")
        out.append(ch)
        i = j + 2
    return "".join(out)


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StompError("Bad encoding", f"{what} is not valid UTF-8") from None


def escape(text: str, version: str, command: str) -> str:
    """A header name or value as it goes on the wire for `version` and `command`."""
    if command in UNESCAPED or version == "1.0":
        # no escaping exists: a CR or LF would end the line, so it becomes a space
        if "\n" in text or "\r" in text:
            return text.replace("\r", " ").replace("\n", " ")
        return text
    if _ESCAPE_RE_11.search(text) is None:
        return text
    return _ESCAPE_RE_11.sub(lambda m: _ESCAPES[m.group()], text)


# -- encoder --------------------------------------------------------------------------

def encode_frame(command: str, headers: Iterable[tuple[str, str]] = (), body: bytes = b"",
                 version: str = "1.2") -> bytes:
    """Bytes of one frame: escaped headers in the given order, `content-length` when
    the body is not empty (any `content-length` in `headers` is ignored), NUL LF."""
    parts = [command, "\n"]
    n = 0  # headers written
    for name, value in headers:
        if name == "content-length":
            continue
        parts += (name, ":", value, "\n")
        n += 1
    if body:
        parts += ("content-length:", str(len(body)), "\n")
    parts.append("\n")
    head = "".join(parts)
    # the head as it is when no name or value holds a character to escape: its colons
    # and line feeds are then only the separators put in above (one count over the head
    # instead of a search of each name and value); else each name and value is escaped
    lines = n + (3 if body else 2)
    plain = command in UNESCAPED or version == "1.0"
    if head.count("\n") != lines or "\r" in head or not plain and (
            head.count(":") != lines - 2 or "\\" in head):
        for k in range(2, 2 + 4 * n, 4):
            parts[k] = escape(parts[k], version, command)
            parts[k + 2] = escape(parts[k + 2], version, command)
        head = "".join(parts)
    return head.encode("utf-8") + body + b"\x00\n"


# -- decoder --------------------------------------------------------------------------

_IDLE, _HEADERS, _BODY, _PAUSED = 0, 1, 2, 3


class Decoder:
    """Incremental STOMP parser; see the module's rules."""

    def __init__(self, max_line: int = MAX_LINE, max_headers: int = MAX_HEADERS,
                 max_body: int = MAX_BODY, version: str | None = None) -> None:
        self.max_line = max_line
        self.max_headers = max_headers
        self.max_body = max_body
        self.version = version  # None until negotiated: frames other than CONNECT as 1.2
        self._buf = bytearray()
        self._pos = 0          # first byte not yet consumed
        self._scan = 0         # where the next search for LF / NUL starts
        self._state = _IDLE
        self._command = ""
        self._headers: dict[str, str] = {}
        self._count = 0
        self._length: int | None = None
        self._error: StompError | None = None

    def negotiated(self, version: str) -> None:
        """The server answered CONNECT with `version`: frames from now on use its
        escaping. Call `feed(b"")` afterwards for the bytes that waited."""
        if version not in VERSIONS:
            raise ValueError(f"unknown STOMP version {version!r}")
        self.version = version
        if self._state == _PAUSED:
            self._state = _IDLE

    @property
    def paused(self) -> bool:
        """True after a CONNECT/STOMP frame until `negotiated()`."""
        return self._state == _PAUSED

    @property
    def buffered(self) -> int:
        """Bytes held that are not yet part of an emitted event."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> list[Frame | HeartBeat]:
        if self._error is not None:
            raise self._error
        buf = self._buf
        if self._pos:  # cheap: CPython drops a bytearray's head without copying
            del buf[:self._pos]
            self._scan -= self._pos
            self._pos = 0
        if data:
            buf += data
        events: list[Frame | HeartBeat] = []
        try:
            self._run(events)
        except StompError as e:
            e.frames = events
            self._error = e
            raise
        return events

    def _run(self, events: list[Frame | HeartBeat]) -> None:
        while True:
            state = self._state
            if state == _IDLE:
                if not self._skip_noise(events):
                    return
                line = self._line("command")
                if line is None:
                    return
                self._command = _utf8(line, "the command")
                self._headers = {}
                self._count = 0
                self._state = _HEADERS
            elif state == _HEADERS:
                if self._count == 0 and self._block():
                    continue
                line = self._line("header")
                if line is None:
                    return
                if line:
                    self._header(line, line.find(b"\\") >= 0)
                else:
                    self._start_body()
            elif state == _BODY:
                frame = self._body()
                if frame is None:
                    return
                events.append(frame)
                if frame.command in ("CONNECT", "STOMP") and self.version is None:
                    self._state = _PAUSED  # rule 3: wait for negotiated()
                    return
                self._state = _IDLE
            else:
                return

    def _skip_noise(self, events: list[Frame | HeartBeat]) -> bool:
        """Skip EOLs (a heart-beat) and NULs between frames; False when out of bytes."""
        buf, pos, end = self._buf, self._pos, len(self._buf)
        while pos < end:
            c = buf[pos]
            if c == LF:
                events.append(_HEARTBEAT)
                pos += 1
            elif c == NUL:
                pos += 1
            elif c == CR:
                if pos + 1 >= end:
                    break  # wait: CR LF may be split
                if buf[pos + 1] != LF:
                    self._pos = pos
                    raise StompError("Bad frame", "CR not followed by LF between frames")
                events.append(_HEARTBEAT)
                pos += 2
            else:
                break
        self._pos = pos
        self._scan = max(self._scan, pos)
        return pos < end and buf[pos] != CR

    def _line(self, what: str) -> bytes | None:
        """The next line without its EOL, or None until its LF has arrived."""
        buf, pos = self._buf, self._pos
        limit = pos + self.max_line + 2  # the line, CR, LF
        i = buf.find(b"\n", max(self._scan, pos), limit)
        if i < 0:
            if len(buf) >= limit:
                raise StompError("Frame too large",
                                 f"{what} line longer than {self.max_line} bytes")
            self._scan = len(buf)
            return None
        end = i - 1 if i > pos and buf[i - 1] == CR else i
        if end - pos > self.max_line:
            raise StompError("Frame too large", f"{what} line longer than {self.max_line} bytes")
        line = bytes(buf[pos:end])
        self._pos = self._scan = i + 1
        return line

    def _block(self) -> bool:
        """Every header line of the frame at once, when its whole header block has
        arrived with LF line ends and within the limits (the common case: one split
        instead of a search per line); False leaves it to the line-by-line path, which
        also finds and reports what is wrong."""
        buf, pos = self._buf, self._pos
        j = buf.find(b"\n\n", pos, pos + BLOCK_MAX)
        if j < 0:
            return False  # not all here (or no header at all, or CR LF line ends, or big)
        block = bytes(buf[pos:j])
        if block.find(b"\r") >= 0:
            return False
        lines = block.split(b"\n")
        for line in lines:
            if len(line) > self.max_line or not line:
                return False
        self._pos = self._scan = j + 2
        backslash = block.find(b"\\") >= 0
        for line in lines:
            self._header(line, backslash)
        self._start_body()
        return True

    def _header(self, line: bytes, backslash: bool) -> None:
        """One header line; `backslash`: it may hold one (else no unescaping is due)."""
        self._count += 1
        if self._count > self.max_headers:
            raise StompError("Frame too large",
                             f"more than {self.max_headers} headers in a {self._command} frame")
        colon = line.find(b":")
        if colon < 0:
            text = line[:60].decode("utf-8", "replace")
            raise StompError("Bad header", f"header line without a colon: {text!r}")
        if colon == 0:
            raise StompError("Bad header", "header line with an empty name")
        raw_name, raw_value = line[:colon], line[colon + 1:]
        version = self.version
        if not backslash or self._command in UNESCAPED or version == "1.0":
            name = _utf8(raw_name, "a header name")
            try:  # (the error's text is made only for an error: this runs per header)
                value = raw_value.decode("utf-8")
            except UnicodeDecodeError:
                raise StompError("Bad encoding", f"the value of header {name!r} is not "
                                 "valid UTF-8") from None
        else:
            name = _unescape(raw_name, _UNESCAPE, "a header name")
            value = _unescape(raw_value, _UNESCAPE, f"the value of header {name!r}")
        if name not in self._headers:  # rule 4: the first one wins
            self._headers[name] = value

    def _start_body(self) -> None:
        self._state = _BODY
        self._length = None
        raw = self._headers.get("content-length")
        if raw is None:
            return
        text = raw.strip()
        if not text.isdigit() or not text.isascii():
            raise StompError("Bad header", f"content-length is not a number: {raw[:40]!r}")
        n = int(text)
        if n > self.max_body:
            raise StompError("Frame too large", f"{self._command} body of {n} bytes is over "
                                                f"the limit of {self.max_body} bytes")
        self._length = n

    def _body(self) -> Frame | None:
        buf, pos, n = self._buf, self._pos, self._length
        if n is not None:
            if len(buf) - pos < n + 1:
                return None
            if buf[pos + n] != NUL:
                raise StompError("Bad frame", f"{self._command} body longer than "
                                              f"content-length {n} (no NUL after {n} bytes)")
            body = bytes(buf[pos:pos + n])
            self._pos = self._scan = pos + n + 1
        else:
            i = buf.find(b"\x00", max(self._scan, pos))
            if i < 0:
                if len(buf) - pos > self.max_body:
                    raise StompError("Frame too large", f"{self._command} body over the limit "
                                                        f"of {self.max_body} bytes (no NUL yet)")
                self._scan = len(buf)
                return None
            if i - pos > self.max_body:
                raise StompError("Frame too large", f"{self._command} body of {i - pos} bytes "
                                                    f"is over the limit of {self.max_body} bytes")
            body = bytes(buf[pos:i])
            self._pos = self._scan = i + 1
        return Frame(self._command, self._headers, body)
