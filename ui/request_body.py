"""A JSON request body read as it arrives, with its data: URLs decoded to files on the way in.

An OpenAI request carries its videos and pictures as data: URLs inside the JSON: up to the upload limit each,
4/3 of it as text. Collected first and parsed after, a body costs three to four times its size (the bytes, the
parsed string, the decoded file) and the parse blocks the event loop. Here the body is scanned as its chunks
arrive: the text of every string that is the value of a `url`, `video_url` or `image_url` key and begins with
a base64 data: URL header goes straight through a `Base64File` decoder into a file (refused the moment it passes
the upload limit or stops being base64), and the JSON keeps a placeholder string in its place, which
`ui.video_inputs.local_files` resolves to that file. The rest of the JSON, its text, is kept, within
MAX_TEXT_BYTES. The scanning runs on a worker thread a batch at a time, so the event loop only moves chunks.

Bodies past SMALL_BODY_BYTES (or of unknown length) are received at most MAX_LARGE_BODIES at a time; another is
refused as busy at once, so that a crowd of slow uploads holds at most that many files and threads.
"""

import asyncio
import json
import re
import secrets
import threading
from collections.abc import AsyncIterator

from engine.errors import InputError
from ui.video_inputs import BAD_BASE64, Base64File, LocalVideo, VideoPolicy, data_url_media_type

MB = 1 << 20
# Everything of a request but its data: URLs: the question and history (65,536 + 4,000 characters by default, up
# to 12 bytes each when JSON escapes them as surrogate pairs) and the structure around them, with room to spare.
MAX_TEXT_BYTES = 8 * MB
SMALL_BODY_BYTES = 1 * MB  # a body that declares itself this small is never made to wait for a large one's turn
MAX_LARGE_BODIES = 8
BATCH_BYTES = 1 * MB  # received bytes handed to the scanning thread at a time
MAX_BODY_DEPTH = 32
# JSON objects and arrays in a body: a conversation at the engine's limits holds some thousands (516 messages, a
# content list and a few parts each). Parsed, each is a Python container the garbage collector walks: 60,000 made
# a full collection that held every request up for seconds.
MAX_CONTAINERS = 16_384
MEDIA_KEYS = (b"url", b"video_url", b"image_url")
HEADER_BYTES = 256  # the most of a string read to tell a data: URL's header ("data:video/mp4;base64,") from text
STRING_END = re.compile(rb'["\\]')  # the end of a JSON string, or an escape inside it
WHITESPACE = b" \t\n\r"
NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"{}[]")

TEXT_TOO_LARGE = (
    f"The request's text (everything but its data: URLs) is larger than the limit of {MAX_TEXT_BYTES // MB} MB."
)
NOT_JSON = "The request body must be JSON."
TOO_DEEP = f"The request body nests JSON deeper than {MAX_BODY_DEPTH} levels."
TOO_MANY_CONTAINERS = f"The request body holds more than {MAX_CONTAINERS:,} JSON objects and arrays."
LARGE_BODIES_BUSY = (
    "The server is receiving as many large requests as it takes at once right now; please try again in a minute."
)


class BodyRefused(InputError):
    """A body refused while it arrives: the sentence, and the HTTP status it is answered with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Escaped:
    """A JSON escape inside a data: URL's text, completed a byte at a time (it may span two chunks)."""

    SIMPLE = {ord("/"): b"/", ord("n"): b"", ord("r"): b"", ord("t"): b"", ord("f"): b""}

    def __init__(self):
        self.seen = b""

    def add(self, byte: int) -> bytes | None:
        """The escaped text once complete (b"" for whitespace), else None; InputError for what base64 never holds."""
        self.seen += bytes([byte])
        if self.seen[0] != ord("u"):
            if self.seen[0] not in self.SIMPLE:
                raise InputError(BAD_BASE64)
            return self.SIMPLE[self.seen[0]]
        if len(self.seen) < 5:
            return None
        try:
            char = chr(int(self.seen[1:], 16))
        except ValueError:
            raise InputError(BAD_BASE64) from None
        if not char.isascii():
            raise InputError(BAD_BASE64)
        return char.encode("ascii")


class BodyScanner:
    """The scanning state of one body: `feed` each received piece in order, then `finish`. Thread-safe against
    `discard` (a request that ends while a piece is being scanned)."""

    OUT, STRING, HEADER, DATA = range(4)

    def __init__(self, policy: VideoPolicy, max_text_bytes: int = MAX_TEXT_BYTES):
        self.policy, self.max_text_bytes = policy, max_text_bytes
        self.text = bytearray()
        self.files: dict[str, LocalVideo] = {}  # placeholder -> decoded file
        self._nonce = secrets.token_hex(8)
        self._state = self.OUT
        self._escape = False  # a backslash ended the last piece inside a string
        self._string = bytearray()  # a string's first bytes, to tell a key
        self._key: bytes | None = None  # the last string outside a data: URL, when short
        self._since_key = b""  # what stood between that string and now, whitespace left out (2 bytes at most)
        self._header = bytearray()
        self._sink: Base64File | None = None
        self._escaped: _Escaped | None = None
        self._lock = threading.Lock()
        self._discarded = False
        self._depth = 0  # JSON containers open
        self._containers = 0  # JSON containers opened so far

    def feed(self, data: bytes) -> None:
        with self._lock:
            if self._discarded:
                return
            at = 0
            while at < len(data):
                at = (self._out, self._in_string, self._in_header, self._in_data)[self._state](data, at)
            if len(self.text) > self.max_text_bytes:
                raise BodyRefused(413, TEXT_TOO_LARGE)

    def finish(self) -> bytes:
        """The JSON text with a placeholder for each data: URL; BodyRefused when the body ended inside one."""
        if self._state != self.OUT:
            raise BodyRefused(400, NOT_JSON)
        return bytes(self.text)

    def discard(self) -> None:
        """Delete every file decoded so far (and the one being decoded)."""
        with self._lock:
            self._discarded = True
            if self._sink is not None:
                self._sink.discard()
                self._sink = None
            for file in self.files.values():
                file.release()

    # --- one state each: scan from `at`, return where the scan stopped ---------------------------------------
    def _out(self, data: bytes, at: int) -> int:
        start = data.find(b'"', at)
        end = len(data) if start < 0 else start
        self._count_containers(data[at:end])
        self.text += data[at:end]
        self._since_key = (self._since_key + data[at:end].translate(None, WHITESPACE)[:2])[:2]
        if start < 0:
            return end
        if self._key in MEDIA_KEYS and self._since_key == b":":
            self._state, self._header = self.HEADER, bytearray()
        else:
            self._state, self._string = self.STRING, bytearray()
            self.text += b'"'
        self._key = None
        return start + 1

    def _count_containers(self, structure: bytes) -> None:
        """Follow the depth and count of JSON containers through text outside strings; BodyRefused past
        MAX_BODY_DEPTH or MAX_CONTAINERS, before anything parses the body."""
        opened = structure.count(b"{") + structure.count(b"[")
        closed = structure.count(b"}") + structure.count(b"]")
        if self._depth + opened <= MAX_BODY_DEPTH:
            self._depth += opened - closed
        else:  # it may go too deep within this piece: follow it bracket by bracket
            for byte in structure.translate(None, NOT_BRACKETS):
                self._depth += 1 if byte in b"{[" else -1
                if self._depth > MAX_BODY_DEPTH:
                    raise BodyRefused(400, TOO_DEEP)
        self._containers += opened
        if self._containers > MAX_CONTAINERS:
            raise BodyRefused(400, TOO_MANY_CONTAINERS)

    def _in_string(self, data: bytes, at: int) -> int:
        if self._escape:  # the byte after a backslash is the escape's, never the string's end
            self._escape = False
            self._keep(data[at : at + 1])
            return at + 1
        found = STRING_END.search(data, at)
        end = len(data) if found is None else found.end()
        self._keep(data[at:end])
        if found is None:
            return end
        if data[found.start()] == ord("\\"):
            self._escape = True
        else:  # the string ended
            self._state, self._since_key = self.OUT, b""
            self._key = bytes(self._string[:-1]) if len(self._string) <= 16 else None
        return end

    def _keep(self, piece: bytes) -> None:
        self.text += piece
        if len(self._string) <= 16:
            self._string += piece[:17]

    def _in_header(self, data: bytes, at: int) -> int:
        """A media URL's first bytes, a byte at a time (HEADER_BYTES at most): a base64 data: URL goes on to DATA,
        anything else is text."""
        byte = data[at]
        self._header.append(byte)
        if self._escape:
            self._escape = False
        elif byte == ord("\\"):
            self._escape = True
        elif byte == ord('"'):  # a short string: a path, a link, a data: URL without a comma
            self._as_text()
            self._state, self._since_key = self.OUT, b""
            self._key = bytes(self._header[:-1]) if len(self._header) <= 17 else None
        elif byte == ord(","):
            self._start_data()
        elif len(self._header) >= HEADER_BYTES:
            self._as_text()
            self._state = self.STRING
        return at + 1

    def _as_text(self) -> None:
        self.text += b'"' + self._header
        self._string = bytearray(self._header[:17])

    def _start_data(self) -> None:
        try:
            header = json.loads(b'"' + self._header[:-1] + b'"')
            media_type = data_url_media_type(header[len("data:") :]) if header.startswith("data:") else None
        except (ValueError, InputError):
            media_type = None
        if media_type is None:  # text after all: local_video says what is wrong with it
            self._as_text()
            self._state = self.STRING
            return
        self._sink = Base64File(self.policy, media_type)
        self._state = self.DATA

    def _in_data(self, data: bytes, at: int) -> int:
        if self._escaped is not None:
            done = self._escaped.add(data[at])
            if done is not None:
                self._escaped = None
                self._sink.feed(done)
            return at + 1
        found = STRING_END.search(data, at)
        end = len(data) if found is None else found.start()
        self._sink.feed(data[at:end])
        if found is None:
            return end
        if data[end] == ord("\\"):
            self._escaped = _Escaped()
            return end + 1
        placeholder = f"evs-received-{self._nonce}:{len(self.files)}"
        self.files[placeholder] = self._sink.finish()
        self._sink = None
        self.text += b'"' + placeholder.encode() + b'"'
        self._state, self._since_key, self._key = self.OUT, b"", None
        return end + 1


class LargeBodies:
    """How many large bodies are being received; one per route set (all on one event loop)."""

    def __init__(self, most: int = MAX_LARGE_BODIES):
        self.most, self.receiving = most, 0


async def receive_body(
    chunks: AsyncIterator[bytes], declared: int | None, policy: VideoPolicy, body_limit: int, bodies: LargeBodies
) -> tuple[bytes, dict[str, LocalVideo]]:
    """(the JSON text with placeholders, the decoded data: URLs by placeholder) of a body arriving as `chunks`:
    BodyRefused 413 past body_limit bytes or MAX_TEXT_BYTES of text, 429 when `bodies` are all taken (a large or
    undeclared body, `declared` being its Content-Length), InputError for a data: URL past the upload limit or
    not base64. Whatever was decoded is deleted when it is refused or cancelled."""
    too_large = f"The request is larger than the limit of {body_limit / MB:.3g} MB."
    if declared is not None and declared > body_limit:
        raise BodyRefused(413, too_large)
    large = declared is None or declared > SMALL_BODY_BYTES
    if large and bodies.receiving >= bodies.most:
        raise BodyRefused(429, LARGE_BODIES_BUSY)
    bodies.receiving += int(large)
    scanner = BodyScanner(policy)
    try:
        batch, received = bytearray(), 0
        async for chunk in chunks:
            received += len(chunk)
            if received > body_limit:
                raise BodyRefused(413, too_large)
            batch += chunk
            if len(batch) >= BATCH_BYTES:
                await asyncio.to_thread(scanner.feed, bytes(batch))
                batch.clear()
        await asyncio.to_thread(scanner.feed, bytes(batch))
        return scanner.finish(), scanner.files
    except BaseException:
        scanner.discard()
        raise
    finally:
        bodies.receiving -= int(large)
