"""The launched app serves no file outside its uploads and `assets/examples` through any of Gradio's file
routes (issue 11, item 6).

Gradio 6.31's routes that answer with a file named by the caller (gradio/routes.py):
- `GET|HEAD /gradio_api/file={path}` and its older spelling `GET /gradio_api/file/{path}`: any file under
  the upload folder (GRADIO_TEMP_DIR), Gradio's examples cache, or the launch's `allowed_paths` (the app
  allows `assets/examples` only, ui/layout.py launch_kwargs);
- `/static/{path}`, `/assets/{path}`, `/svelte/{path}`: Gradio's own front-end files, joined safely under
  Gradio's package folders (they serve Gradio's files by design: only escaping them is tested here);
- `/gradio_api/proxy={url}` (only for Spaces loaded with gr.load) and `/gradio_api/custom_component/...`;
- `/file=` and `/file/` at the root were Gradio 4's spellings; they must stay gone (404).

Each route gets every spelling of every target: an absolute path, `../` from the working folder, `../`
from inside an allowed folder (the examples, the upload folder), `%2f`- and `%2e%2e%2f`-encoded, double
encoded (`%252e%252e%252f`), `..%2f`, `file://`, a NUL byte, `....//`, and a folder beside the upload folder whose
name only extends it (a prefix check would let it through). Targets: a secret file the test writes in its
own tmp folder, `/proc/self/environ`, `/etc/passwd`, and the repo's own `app.py`. An answer passes when its
status is 400, 403 or 404 (or 405 for a HEAD where the route has none) and the body holds none of the
target's content. The status matters on its own: a /proc file stats as 0 bytes, so a route that allowed it
would answer 200 with an empty body. Requests go over real HTTP with http.client (what urllib sends
through), which puts the path on the wire byte for byte; httpx would resolve `..` before sending. Two
positive checks keep this from passing vacuously: an upload is served back, and so is an example clip.
"""

import http.client
import secrets
import urllib.parse
from pathlib import Path

import httpx
import pytest

import ui.layout
from app_harness import launched_app

ROOT = Path(__file__).resolve().parent.parent
REFUSED = {400, 403, 404}
REFUSED_HEAD = REFUSED | {405}  # routes without HEAD (/gradio_api/file/) answer Method Not Allowed
FILE_ROUTES = ["/gradio_api/file=", "/gradio_api/file/", "/file=", "/file/"]
STATIC_ROUTES = ["/static/", "/assets/", "/svelte/", "/gradio_api/custom_component/a/client/b/"]
PROXY_ROUTE = "/gradio_api/proxy="


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_cache_dir):
    """The harness's app with its own upload folder (as app.py gives it one), a secret file beside that
    folder, and another in a folder whose name extends the upload folder's."""
    home = tmp_path_factory.mktemp("file-routes")
    upload_dir = home / "gradio-temp"
    token = f"SECRET-{secrets.token_hex(8)}"
    secret = home / "secret.txt"
    secret.write_text(token)
    sibling = home / "gradio-temp-sibling" / "secret.txt"
    sibling.parent.mkdir()
    sibling.write_text(token)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(upload_dir))
        with launched_app(tiny_cache_dir) as running:
            yield dict(url=running.url, upload_dir=upload_dir, secret=secret, sibling=sibling, token=token)


def request(url: str, path: str, method: str = "GET", headers: dict | None = None) -> tuple[int, bytes]:
    """One request with `path` sent exactly as written (no normalising of `..` or re-encoding)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def spellings(target: str, inside: list[Path]) -> list[str]:
    """Ways to name an absolute `target` path in a URL."""
    up = "../" * 16
    relative = up + target.lstrip("/")
    names = [
        target,
        relative,
        target.replace("/", "%2f"),
        relative.replace("../", "%2e%2e%2f"),
        relative.replace("../", "%252e%252e%252f"),
        relative.replace("../", "..%2f"),
        relative.replace("../", "....//"),
        "file://" + target,
        target + "%00.mp4",
    ]
    # `..` out of a folder the app does serve from
    names += [f"{folder}/{up}{target.lstrip('/')}" for folder in inside]
    names += [f"{folder}/{up.replace('../', '%2e%2e%2f')}{target.lstrip('/')}" for folder in inside]
    return names


def leaks(body: bytes, needles: list[bytes]) -> bool:
    return any(needle in body for needle in needles)


def check_refused(
    url: str,
    routes: list[str],
    targets: dict[str, list[bytes]],
    inside: list[Path],
    methods=("GET",),
    skip=lambda route, name: False,
) -> list[str]:
    """Every route x target x spelling x method; returns a line for each answer that was not refused."""
    failures = []
    for route in routes:
        for target, needles in targets.items():
            for name in spellings(target, inside):
                if skip(route, name):
                    continue
                for method in methods:
                    status, body = request(url, route + name, method)
                    if status not in (REFUSED_HEAD if method == "HEAD" else REFUSED) or leaks(body, needles):
                        failures.append(f"{method} {route}{name} -> {status} {body[:60]!r}")
    return failures


@pytest.fixture(scope="module")
def targets(served) -> dict[str, list[bytes]]:
    """Absolute path -> byte strings whose presence in a body means the file was served."""
    app_source = (ROOT / "app.py").read_bytes()
    return {
        str(served["secret"]): [served["token"].encode()],
        str(served["sibling"]): [served["token"].encode()],
        "/proc/self/environ": [b"PATH=", b"HOME="],
        "/etc/passwd": [b"root:"],
        str(ROOT / "app.py"): [app_source[:200], b"def main"],
    }


def test_file_routes_serve_nothing_outside_uploads_and_examples(served, targets):
    """/gradio_api/file= (GET and HEAD, a HEAD 200 would confirm the file exists and its size) and
    /gradio_api/file/, plus Gradio 4's root spellings: every spelling of every target is refused."""
    inside = [ui.layout.EXAMPLES_DIR, served["upload_dir"]]
    failures = check_refused(served["url"], FILE_ROUTES, targets, inside, methods=("GET", "HEAD"))
    status, body = request(served["url"], f"/gradio_api/file={served['secret']}", headers={"Range": "bytes=0-5"})
    if status not in REFUSED or leaks(body, targets[str(served["secret"])]):
        failures.append(f"ranged GET of the secret -> {status} {body!r}")
    assert not failures, "\n".join(failures)


def test_gradio_front_end_routes_cannot_be_escaped(served, targets):
    """/static, /assets, /svelte and the custom-component route serve Gradio's own front-end files from
    its package folders; no spelling of `..` or an absolute path gets out of them."""
    failures = check_refused(served["url"], STATIC_ROUTES, targets, inside=[])
    assert not failures, "\n".join(failures)


def test_the_proxy_route_reads_no_local_file_or_loopback_url(served, targets):
    """/gradio_api/proxy= fetches URLs of Spaces the app loaded (none here), and /gradio_api/file= also
    takes http(s) URLs (fetched from public addresses only): neither reads a local path or reaches the
    server's own loopback address (an SSRF into whatever listens there)."""
    # A NUL byte makes Gradio's reverse proxy fail with a 500 (httpx.InvalidURL, unhandled; nothing is
    # served); it is not a file route, so that spelling is left to the file routes above.
    failures = check_refused(served["url"], [PROXY_ROUTE], targets, inside=[], skip=lambda route, name: "%00" in name)
    for route in (PROXY_ROUTE, "/gradio_api/file="):
        status, body = request(served["url"], f"{route}{served['url'].rstrip('/')}/config")
        if status not in REFUSED or b"components" in body:
            failures.append(f"GET {route}<the app's own /config> -> {status} {body[:60]!r}")
    assert not failures, "\n".join(failures)


def test_uploads_and_example_clips_are_served(served, clip):
    """The positive side, so that the refusals above are not a server that serves nothing: a file uploaded
    through POST /gradio_api/upload comes back byte for byte from /gradio_api/file=, and so does an
    example clip from assets/examples."""
    video = clip("moving_object")
    with httpx.Client(base_url=served["url"], timeout=30) as client:
        with video.open("rb") as file:
            uploaded = client.post("/gradio_api/upload", files={"files": (video.name, file, "video/mp4")})
        assert uploaded.status_code == 200, uploaded.text
        [path] = uploaded.json()
        assert Path(path).resolve().is_relative_to(served["upload_dir"].resolve())
        served_back = client.get(f"/gradio_api/file={path}")
        assert served_back.status_code == 200 and served_back.content == video.read_bytes()

        examples = sorted(ui.layout.EXAMPLES_DIR.glob("*.mp4"))
        assert examples, "no example clips in assets/examples to check"
        example = client.get(f"/gradio_api/file={examples[0]}")
        assert example.status_code == 200 and example.content == examples[0].read_bytes()
