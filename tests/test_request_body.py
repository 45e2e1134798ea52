"""A JSON body scanned as it arrives (ui/request_body.py): data: URLs of media keys decoded to files on the way in,
whatever the chunks, and refused the moment they go wrong; the rest kept as the JSON text."""

import asyncio
import base64
import json
import random
import re

import pytest

from engine.errors import InputError
from ui.request_body import (
    MAX_CONTAINERS,
    MAX_TEXT_BYTES,
    TEXT_TOO_LARGE,
    TOO_DEEP,
    TOO_MANY_CONTAINERS,
    BodyRefused,
    BodyScanner,
)
from ui.video_inputs import BAD_BASE64, BAD_DATA_URL, VideoPolicy, local_files

VIDEO = bytes(range(256)) * 40 + b"tail"  # every byte value, not a multiple of 3 long: padding at the end
PICTURE = b"\x89PNG fake picture bytes/+"


def policy(tmp_path, max_bytes: int = 1 << 20) -> VideoPolicy:
    return VideoPolicy(upload_dir=tmp_path, max_bytes=max_bytes)


def escaped_base64(data: bytes) -> str:
    """base64 as some JSON writers send it: every "/" escaped (PHP's json_encode), a line break every 76
    characters (MIME), and one letter as a \\u escape; json.dumps adds the escapes of the line breaks."""
    text = base64.b64encode(data).decode()
    lines = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    return json.dumps(lines).replace("/", "\\/").replace("A", "\\u0041", 1)[1:-1]


def chat_body(video_url: str, picture_url: str) -> bytes:
    """A chat request with text that holds an escaped quote and looks like a data: URL but is no media key's value, a
    video_url part (url in a dict) and an image_url part given as a bare string."""
    return (
        '{"model": "m", "messages": [{"role": "user", "content": ['
        '{"type": "text", "text": "data:video/mp4;base64,AAAA is not a \\"video here"}, '
        f'{{"type": "video_url", "video_url": {{"url": "{video_url}"}}}}, '
        f'{{"type": "image_url", "image_url": "{picture_url}"}}]}}], '
        '"url": "data:text/plain;base64,QQ==", "pruning_rate": 0.5}'
    ).encode()


def scan(body: bytes, pieces: list[int], scanner: BodyScanner) -> bytes:
    at = 0
    for size in pieces:
        scanner.feed(body[at : at + size])
        at += size
    scanner.feed(body[at:])
    return scanner.finish()


def test_data_urls_decode_to_files_whatever_the_chunks(tmp_path):
    """Split at every byte, at random sizes and whole: the same JSON text, placeholders where the media keys' data:
    URLs were (escaped, wrapped and all), and files holding exactly their bytes; every other string untouched."""
    body = chat_body(
        f"data:video\\/mp4;base64,{escaped_base64(VIDEO)}", f"data:image/png;base64,{escaped_base64(PICTURE)}"
    )
    expected = json.loads(body)
    rng = random.Random(0)
    splits = [[1] * len(body), [rng.randint(1, 40) for _ in range(len(body) // 20)], []]
    texts = set()
    for pieces in splits:
        scanner = BodyScanner(policy(tmp_path))
        payload = json.loads(scan(body, pieces, scanner))
        parts = payload["messages"][0]["content"]
        video, picture = parts[1]["video_url"]["url"], parts[2]["image_url"]
        assert set(scanner.files) == {video, picture}
        assert scanner.files[video].path.read_bytes() == VIDEO
        assert scanner.files[picture].path.read_bytes() == PICTURE
        assert scanner.files[video].path.suffix == ".mp4" and scanner.files[picture].path.suffix == ".png"
        # Untouched: a text part and a key that is no media's, though both look like data: URLs.
        assert parts[0] == expected["messages"][0]["content"][0]
        assert payload["url"] == "data:text/plain;base64,QQ==" and payload["pruning_rate"] == 0.5
        texts.add(json.dumps({**payload, "messages": None}))
        scanner.discard()
        assert not any(tmp_path.rglob("*.*")), "discard left a file"
    assert len(texts) == 1


def test_placeholders_resolve_to_the_decoded_files(tmp_path):
    scanner = BodyScanner(policy(tmp_path))
    body = chat_body(f"data:video/mp4;base64,{base64.b64encode(VIDEO).decode()}", "/not/uploaded.png")
    payload = json.loads(scan(body, [], scanner))
    url = payload["messages"][0]["content"][1]["video_url"]["url"]
    [file] = asyncio.run(local_files([url], policy(tmp_path), scanner.files))
    assert file.path.read_bytes() == VIDEO
    with pytest.raises(InputError):  # a path that is not this server's upload is still refused as before
        asyncio.run(local_files([url, "/not/uploaded.png"], policy(tmp_path), scanner.files))


@pytest.mark.parametrize(
    "payload, sentence",
    [("AAAA!AAA", BAD_BASE64), ("AA=A", BAD_BASE64), ("AA\\\\AA", BAD_BASE64), ("AA\\u00e9A", BAD_BASE64)],
)
def test_a_payload_that_is_not_base64_is_refused_as_it_arrives(tmp_path, payload, sentence):
    """Refused at the first bad character: the rest of the body (here, never sent) is not waited for."""
    scanner = BodyScanner(policy(tmp_path))
    with pytest.raises(InputError, match=sentence):
        scanner.feed(f'{{"url": "data:video/mp4;base64,{payload}'.encode())
    scanner.discard()
    assert not any(tmp_path.rglob("*.mp4"))


def test_a_data_url_past_the_limit_is_refused_before_the_rest_arrives(tmp_path):
    limit = 1000
    scanner = BodyScanner(policy(tmp_path, limit))
    start = b'{"url": "data:image/png;base64,'
    scanner.feed(start + base64.b64encode(b"x" * 999))
    with pytest.raises(InputError, match="The picture is larger than the limit"):
        scanner.feed(base64.b64encode(b"x" * 3))
    scanner.discard()
    assert not any(tmp_path.rglob("*.png"))


def test_other_data_urls_stay_text_for_their_own_sentence(tmp_path):
    """A media key's data: URL that is not base64, or of text, is kept as sent: local_video says what is wrong."""
    scanner = BodyScanner(policy(tmp_path))
    urls = ["data:video/mp4,rawbytes", "data:text/plain;base64,QQ==", "https://example.com/v.mp4", "data:" + "x" * 300]
    body = json.dumps({"messages": [{"url": url} for url in urls]}).encode()
    assert json.loads(scan(body, [7] * 60, scanner)) == json.loads(body)
    assert not scanner.files


def test_text_past_its_limit_is_refused(tmp_path):
    scanner = BodyScanner(policy(tmp_path), max_text_bytes=1000)
    scanner.feed(b'{"url": "data:video/mp4;base64,' + base64.b64encode(b"v" * 3000) + b'", "text": "')
    with pytest.raises(BodyRefused, match="text") as refused:
        scanner.feed(b"q" * 1001)
    assert refused.value.status == 413
    assert str(refused.value) == TEXT_TOO_LARGE and MAX_TEXT_BYTES >= 4 << 20


def test_a_body_that_ends_inside_a_data_url_is_not_json(tmp_path):
    scanner = BodyScanner(policy(tmp_path))
    scanner.feed(b'{"url": "data:video/mp4;base64,AAAA')
    with pytest.raises(BodyRefused) as refused:
        scanner.finish()
    assert refused.value.status == 400
    scanner.discard()


def test_a_bad_data_url_header_reads_as_before(tmp_path):
    """The MCP tool's data: URLs, given whole, are decoded by the same decoder: the same sentences."""
    from ui.video_inputs import _decode_data_url

    with pytest.raises(InputError, match=BAD_DATA_URL):
        _decode_data_url("data:text/plain;base64,QQ==", policy(tmp_path))
    with pytest.raises(InputError, match=BAD_BASE64):
        _decode_data_url("data:video/mp4;base64,QQ=", policy(tmp_path))
    file = _decode_data_url(f"data:video/mp4;base64,{base64.encodebytes(VIDEO).decode()}", policy(tmp_path))
    assert file.path.read_bytes() == VIDEO
    file.release()


@pytest.mark.parametrize("pieces", [[], [1] * 200])
def test_depth_and_count_of_containers_are_followed_as_the_body_arrives(tmp_path, pieces):
    """Whole or a byte at a time: 32 levels pass and 33 are refused, brackets inside strings do not count, and past
    MAX_CONTAINERS objects and arrays the body is refused before anything parses it."""
    deepest = "[" * 31 + '{"a": "[[[[{{{{"}' + "]" * 31
    assert json.loads(scan(deepest.encode(), pieces, BodyScanner(policy(tmp_path)))) == json.loads(deepest)
    with pytest.raises(BodyRefused, match=re.escape(TOO_DEEP)):
        scan(("[" * 33).encode(), pieces, BodyScanner(policy(tmp_path)))

    def wide(containers: int) -> bytes:
        return b"[" + b"{}, " * (containers - 2) + b"[]]"

    assert len(json.loads(scan(wide(MAX_CONTAINERS), pieces, BodyScanner(policy(tmp_path))))) == MAX_CONTAINERS - 1
    with pytest.raises(BodyRefused, match=re.escape(TOO_MANY_CONTAINERS)) as refused:
        scan(wide(MAX_CONTAINERS + 1), pieces, BodyScanner(policy(tmp_path)))
    assert refused.value.status == 400
