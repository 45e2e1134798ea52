"""A share of the queue per client: one user (a browser tab, a gradio_client, an API caller's address) may have at
most `max_client_requests` questions waiting or being answered at once, so that one client sending `max_queue`
requests cannot take every slot and leave every other user told the server is busy. Past its share a client is
told to wait (a BusyError: HTTP 429 on the OpenAI route); others are still admitted. Counted where admission is
(Engine.submit, ReplicatedEngine.submit), beside the queue's own bound; a caller that names no client (the Python
API, benchmarks) takes no share."""

import threading

from engine.errors import BusyError

CLIENT_BUSY = (
    "You already have {count} questions waiting or being answered, as many as this server takes from one user at "
    "once; please wait for one of them to finish."
)


class ClientShare:
    """One request's place in its client's share, given back once (release) when the request ends."""

    def __init__(self, shares: "ClientShares | None", client: str | None):
        self._shares, self._client = shares, client

    def release(self) -> None:
        shares, self._shares = self._shares, None
        if shares is not None:
            shares._give_back(self._client)


class ClientShares:
    """Requests under way per client, each client at most `per_client`."""

    def __init__(self, per_client: int):
        if per_client < 1:
            raise ValueError(f"max_client_requests must be at least 1, not {per_client!r}")
        self.per_client = per_client
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, client: str | None) -> ClientShare:
        """A place in `client`'s share; BusyError (CLIENT_BUSY) when it already holds all of it."""
        if client is None:
            return ClientShare(None, None)
        with self._lock:
            held = self._held.get(client, 0)
            if held >= self.per_client:
                raise BusyError(CLIENT_BUSY.format(count=held))
            self._held[client] = held + 1
        return ClientShare(self, client)

    def held(self, client: str) -> int:
        """Requests `client` has under way now."""
        with self._lock:
            return self._held.get(client, 0)

    def _give_back(self, client: str) -> None:
        with self._lock:
            left = self._held.get(client, 0) - 1
            if left > 0:
                self._held[client] = left
            else:
                self._held.pop(client, None)  # a client with nothing under way holds no entry: the map stays bounded
