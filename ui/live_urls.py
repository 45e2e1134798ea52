"""Stream URLs a person or program names for a live feed, checked before the server connects: refused
unless the operator turned them on (`--live-urls`, EVS_LIVE_URLS), since a public server must not connect
to addresses for strangers; then read from public addresses only, by the same rule as fetched videos
(ui/video_inputs.py). The feed itself is engine/reading/live_stream.py's.

The check resolves the host once; FFmpeg then connects by name itself, so a name whose address changes
between the two (DNS rebinding), or an HLS playlist whose segments sit on other hosts, is not caught here
(docs/live.md, "Limits").
"""

from urllib.parse import urlsplit

from engine.errors import InputError
from engine.reading.live_stream import check_stream_url
from ui.video_inputs import VideoPolicy, allowed_address

NO_LIVE_URLS = "This server does not read stream URLs; its operator can turn them on with --live-urls."


async def checked_stream_url(url, policy: VideoPolicy) -> str:
    """`url` when this server may read it as a live feed: live URLs on, a scheme a feed reads, a host that
    resolves to allowed addresses only; InputError with one sentence otherwise."""
    if not policy.live_urls:
        raise InputError(NO_LIVE_URLS)
    url = check_stream_url(url)
    parts = urlsplit(url)
    await allowed_address(parts.hostname, parts.port, policy, "stream URL", "reads streams from")
    return url
