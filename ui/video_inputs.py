"""Videos and pictures named by API requests (the OpenAI endpoint's `video_url` and `image_url` parts, the MCP
tool's video and media), turned into files the engine reads; the engine tells which is which by content.

- `data:video/...;base64,...` or `data:image/...;base64,...`: decoded into the app's temp folder, bounded by
  the upload size limit, and deleted when the request ends;
- a path (or `file://` URL, or a `/gradio_api/file=` URL of a file this server holds): only a file under
  Gradio's upload folder, i.e. one uploaded through this server; any other path is refused, so a caller
  cannot make the model read the server's own files;
- `http(s)://` elsewhere: refused unless the operator allows fetching (a public Space must not fetch
  arbitrary URLs for strangers); then fetched from public addresses only, bounded like an upload.

Every refusal is an InputError with one sentence for the caller.
"""

import asyncio
import base64
import binascii
import mimetypes
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from engine.config import MAX_FILE_BYTES
from engine.errors import EXPIRED_VIDEO, NO_VIDEO, InputError
from engine.reading.live_stream import is_public_address

API_VIDEOS_FOLDER = "api-videos"  # under the upload folder, so the temp-file cleaner bounds it too
GRADIO_FILE_ROUTE = "/gradio_api/file="
FETCH_TIMEOUT_S = 30.0
DATA_URL_SLICE = 1 << 20  # characters of a data: URL decoded at a time
MAX_REDIRECTS = 3

NOT_A_VIDEO_URL = (
    "The video_url must be a data:video/...;base64, URL, the path of a file uploaded to this "
    "server (POST /gradio_api/upload), or an http(s) URL."
)
BAD_DATA_URL = (
    "A data: URL must be a base64 video or picture, e.g. data:video/mp4;base64,AAAA... or "
    "data:image/png;base64,AAAA...."
)
BAD_BASE64 = "The data: URL is not valid base64."
NOT_UPLOADED = (
    "Only files uploaded to this server (POST /gradio_api/upload) can be named by path; "
    "send other videos and pictures as data: URLs."
)
# Said for a video_url and an image_url alike: the caller's part may name either.
NO_FETCHING = (
    "This server does not fetch web URLs of videos or pictures; send the file as a data: URL, or upload it "
    "(POST /gradio_api/upload) and send its path."
)


@dataclass(frozen=True)
class VideoPolicy:
    """What a request may name as its video.

    upload_dir: Gradio's upload folder (named paths must lie under it; decoded data: URLs go there too).
    max_bytes: the upload size limit, for data: URLs and fetched files alike.
    fetch_urls: whether http(s) URLs of other hosts are fetched at all.
    live_urls: whether stream URLs (RTSP, RTMP, SRT, HLS, MPEG-TS over HTTP) are read as live feeds at all
    (ui/live_urls.py).
    address_allowed: which resolved addresses may be fetched from (public ones; tests widen it to reach
    a server on the loopback).
    """

    upload_dir: Path
    max_bytes: int
    fetch_urls: bool = False
    live_urls: bool = False
    address_allowed: Callable[[str], bool] = field(default=is_public_address)


def video_policy(
    max_file_bytes: int = MAX_FILE_BYTES, fetch_video_urls: bool = False, live_urls: bool = False
) -> VideoPolicy:
    """The policy of this server: Gradio's upload folder (GRADIO_TEMP_DIR), the upload limit, the fetch and
    live-URL flags."""
    import gradio as gr  # only here: the rest of this module does not need Gradio

    return VideoPolicy(Path(gr.utils.get_upload_folder()), max_file_bytes, fetch_video_urls, live_urls)


@dataclass
class LocalVideo:
    """A file the engine can read; `temporary` ones are deleted by release()."""

    path: Path
    temporary: bool = False

    def release(self) -> None:
        if self.temporary:
            self.path.unlink(missing_ok=True)


def too_large(limit_bytes: int, what: str = "video") -> InputError:
    return InputError(f"The {what} is larger than the limit of {limit_bytes / (1 << 20):.3g} MB.")


async def local_files(
    urls: list[str], policy: VideoPolicy, received: Mapping[str, LocalVideo] | None = None
) -> list["LocalVideo"]:
    """The files behind several URLs, in order (local_video's rules for each); those made before one that fails
    are released. received: data: URLs already decoded while the request arrived (ui/request_body.py), by the
    placeholder the request's JSON holds in their place."""
    made: list[LocalVideo] = []
    try:
        for url in urls:
            if received and isinstance(url, str) and url in received:
                made.append(received[url])
            else:
                made.append(await local_video(url, policy))
    except BaseException:
        for file in made:
            file.release()
        raise
    return made


async def local_video(url: str, policy: VideoPolicy) -> LocalVideo:
    """The file behind a `video_url`."""
    if url is None or (isinstance(url, str) and not url.strip()):
        raise InputError(NO_VIDEO)
    if not isinstance(url, str):
        raise InputError(NOT_A_VIDEO_URL)
    url = url.strip()
    if url.startswith("data:"):
        return await asyncio.to_thread(_decode_data_url, url, policy)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        linked = unquote(parts.path[len(GRADIO_FILE_ROUTE) :]) if parts.path.startswith(GRADIO_FILE_ROUTE) else ""
        if linked and _under_upload_folder(linked, policy):
            # A link to an upload this server holds is read from disk, whatever host name the caller used
            # (behind a proxy the app cannot tell its public name). Gradio names upload folders by the
            # content's hash, so another server's link to the same path is the same file.
            return uploaded_file(linked, policy)
        if not policy.fetch_urls:
            raise InputError(NO_FETCHING)
        return await fetched_video(url, policy)
    if scheme == "file":
        return uploaded_file(unquote(parts.path), policy)
    if scheme == "" and url.startswith("/"):
        return uploaded_file(url, policy)
    raise InputError(NOT_A_VIDEO_URL)


def _under_upload_folder(path: str, policy: VideoPolicy) -> bool:
    """Whether `path` lies in the upload folder once symlinks and `..` are resolved."""
    root = os.path.realpath(policy.upload_dir)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def uploaded_file(path: str, policy: VideoPolicy) -> LocalVideo:
    """A file under the upload folder; anything else is refused."""
    if not _under_upload_folder(path, policy):
        raise InputError(NOT_UPLOADED)
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise InputError(EXPIRED_VIDEO)
    return LocalVideo(Path(real))


def _new_temp_path(policy: VideoPolicy, suffix: str) -> Path:
    folder = Path(policy.upload_dir) / API_VIDEOS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{uuid.uuid4().hex}{suffix}"


def data_url_media_type(header: str) -> str:
    """The media type of a data: URL from its header (what lies between "data:" and the comma), lower case;
    InputError(BAD_DATA_URL) unless it says base64 and a video, a picture or no type at all."""
    media_type, *options = header.split(";")
    media_type = media_type.strip().lower()
    if "base64" not in (o.strip().lower() for o in options) or not (
        media_type.startswith(("video/", "image/")) or media_type in ("", "application/octet-stream")
    ):
        raise InputError(BAD_DATA_URL)
    return media_type


class Base64File:
    """A data: URL's payload decoded into a new file of the API's temp folder as its text arrives (`feed`, any
    number of times, with pieces of any length), so that neither the text nor the bytes are ever held whole:
    refused with a sentence once the bytes pass policy.max_bytes or the text is not base64 (whitespace is
    allowed, as in MIME). `finish` gives the file; `discard` deletes it."""

    WHITESPACE = b" \t\n\r\x0b\x0c"

    def __init__(self, policy: VideoPolicy, media_type: str):
        self.limit = policy.max_bytes
        self.what = "picture" if media_type.startswith("image/") else "video"
        # A suffix for the people reading the folder; the engine reads the kind from the bytes.
        suffix = mimetypes.guess_extension(media_type) if media_type.startswith(("video/", "image/")) else None
        self.path = _new_temp_path(policy, suffix or ".mp4")
        self._file = self.path.open("wb")
        self._left = b""  # text past the last whole group of 4 characters
        self._padded = False  # "=" seen: nothing but more "=" may follow
        self.nbytes = 0

    def feed(self, text: bytes) -> None:
        text = text.translate(None, self.WHITESPACE)
        if not text:
            return
        if self._padded and text.strip(b"="):
            raise InputError(BAD_BASE64)
        if (pad := text.find(b"=")) >= 0:
            if text[pad:].strip(b"="):
                raise InputError(BAD_BASE64)
            self._padded = True
        text = self._left + text
        whole = len(text) // 4 * 4
        self._left = text[whole:]
        try:
            data = base64.b64decode(text[:whole], validate=True)
        except (binascii.Error, ValueError):
            raise InputError(BAD_BASE64) from None
        self.nbytes += len(data)
        if self.nbytes > self.limit:
            raise too_large(self.limit, self.what)
        self._file.write(data)

    def finish(self) -> LocalVideo:
        if self._left:
            raise InputError(BAD_BASE64)
        self._file.close()
        return LocalVideo(self.path, temporary=True)

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def _decode_data_url(url: str, policy: VideoPolicy) -> LocalVideo:
    """A data: URL given whole (the MCP tool's argument), decoded a slice at a time: no copy of it is made."""
    start = url.find(",")
    if start < 0:
        raise InputError(BAD_DATA_URL)
    sink = Base64File(policy, data_url_media_type(url[len("data:") : start]))
    try:
        for at in range(start + 1, len(url), DATA_URL_SLICE):
            piece = url[at : at + DATA_URL_SLICE]
            if not piece.isascii():
                raise InputError(BAD_BASE64)
            sink.feed(piece.encode("ascii"))
        return sink.finish()
    except BaseException:
        sink.discard()
        raise


class _PinnedTransport(httpx.AsyncHTTPTransport):
    """Connects to the address that was checked, not to whatever the name resolves to a moment later
    (DNS rebinding); the Host header and TLS server name stay the URL's."""

    def __init__(self, address: str):
        super().__init__()
        self.address = address

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host  # the Host header was set from it when the request was built
        request.url = request.url.copy_with(host=self.address)
        request.extensions = {**request.extensions, "sni_hostname": host}
        return await super().handle_async_request(request)


async def _checked_address(url: httpx.URL, policy: VideoPolicy) -> str:
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(NOT_A_VIDEO_URL)
    return await allowed_address(url.host, url.port, policy, "video URL", "fetches videos from")


async def allowed_address(host: str, port: int | None, policy: VideoPolicy, noun: str, verb: str) -> str:
    """The first address `host` resolves to, when every one of them is allowed (`policy.address_allowed`);
    else one sentence, "The <noun>'s host ... could not be found." or "This server only <verb> public
    internet addresses."."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise InputError(f"The {noun}'s host {host} could not be found.") from None
    addresses = [info[4][0] for info in infos]
    # Every address must pass: a name with one public and one private address could be steered to either.
    if not addresses or not all(policy.address_allowed(a) for a in addresses):
        raise InputError(f"This server only {verb} public internet addresses.")
    return addresses[0]


async def fetched_video(url: str, policy: VideoPolicy) -> LocalVideo:
    """Download `url` into the temp folder, bounded by policy.max_bytes; redirects are checked hop by hop."""
    target = httpx.URL(url)
    path = _new_temp_path(policy, Path(target.path).suffix[:8] or ".mp4")
    try:
        for _ in range(MAX_REDIRECTS + 1):
            address = await _checked_address(target, policy)
            async with httpx.AsyncClient(transport=_PinnedTransport(address), timeout=FETCH_TIMEOUT_S) as client:
                async with client.stream("GET", target) as response:
                    if response.is_redirect and "location" in response.headers:
                        target = target.join(response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise InputError(
                            f"Fetching the video URL failed: the server answered HTTP {response.status_code}."
                        )
                    declared = int(response.headers.get("content-length") or 0)
                    if declared > policy.max_bytes:
                        raise too_large(policy.max_bytes)
                    received = 0
                    with path.open("wb") as file:
                        async for chunk in response.aiter_bytes():
                            received += len(chunk)
                            if received > policy.max_bytes:
                                raise too_large(policy.max_bytes)
                            file.write(chunk)
                    return LocalVideo(path, temporary=True)
        raise InputError(f"The video URL redirected more than {MAX_REDIRECTS} times.")
    except httpx.HTTPError as error:
        path.unlink(missing_ok=True)
        raise InputError(f"The video URL could not be fetched ({type(error).__name__}).") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
