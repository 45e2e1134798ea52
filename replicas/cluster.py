"""Reaching Ray: a cluster joined or started, and the replicas deployed, each within a bounded time, or one
sentence (ReplicasUnavailable) that says what failed, the address tried and what to check, never a traceback.

Ray's own client retries an address where nothing answers for minutes without a word, so an address is first
tried with a plain TCP connection (PROBE_TIMEOUT_S); joining then has JOIN_TIMEOUT_S (an address that accepts
connections but is no Ray cluster), and the replicas READY_TIMEOUT_S to load their model and answer the warm-up
clip (a cluster without room for them never schedules them).
"""

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import ray
from ray import serve
from ray.serve.schema import ApplicationStatus

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE_TIMEOUT_S = 5.0
JOIN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 900.0  # a large model's first load and warm-up on each replica
GCS_PORT, CLIENT_PORT = 6379, 10001  # Ray's defaults: the head node's GCS, and Ray Client (ray://)

CHECK_CLUSTER = (
    "check that the cluster is running (`ray status` on its head node) and that this machine can reach that "
    "address and port"
)
UNREACHABLE = "Nothing answers at the Ray cluster address {address} (RAY_ADDRESS): {reason}; " + CHECK_CLUSTER + "."
NOT_AN_ADDRESS = "RAY_ADDRESS={address!r} is not an address: give host:port of the cluster's head node, or auto."
SILENT = (
    "The Ray cluster at {address} (RAY_ADDRESS) did not let this app join within {seconds:g} s; check that it is a "
    "Ray cluster's address (the head node's GCS port, 6379 by default) and that the cluster is healthy "
    "(`ray status` on its head node)."
)
JOIN_FAILED = "Could not join the Ray cluster at {address} (RAY_ADDRESS): {why}; " + CHECK_CLUSTER + "."
LOCAL_FAILED = (
    "Ray could not start a local cluster: {why}; check that its temporary folder (RAY_TMPDIR, else /tmp/ray) is "
    "writable and has room, and that /dev/shm has room."
)
NOT_READY = (
    "The {replicas} engine replicas were not ready within {seconds:g} s: the Ray cluster may have too few free "
    "CPUs or GPUs for them (`ray status` shows what it has)."
)


class ReplicasUnavailable(RuntimeError):
    """The replicas could not be started (no cluster, too few GPUs, a model that does not load); one sentence."""


def connect(address: str | None, num_cpus: int | None, quiet: bool) -> None:
    """Join the cluster at `address` (host:port, ray://host:port, or auto), or start a local one (None)."""
    options = {"log_to_driver": not quiet, "include_dashboard": False}
    if address is None:
        # The replicas unpickle EngineConfig and import engine/ and replicas/ from this checkout, whatever the
        # directory the app was started from.
        python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        runtime_env = {"env_vars": {"PYTHONPATH": python_path}}
        try:
            ray.init(**options, address="local", num_cpus=num_cpus, runtime_env=runtime_env)
        except Exception as error:
            with contextlib.suppress(Exception):
                ray.shutdown()  # whatever it started before it failed
            raise ReplicasUnavailable(LOCAL_FAILED.format(why=last_line(error))) from None
        return
    check_reachable(address)
    outcome: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(**options, address=address)
        except BaseException as error:
            outcome.append(error)

    # On a thread: when the address accepts connections but never answers as Ray, ray.init retries without end,
    # and the app must still be able to say so and exit.
    joining = threading.Thread(target=join, name="ray-join", daemon=True)
    joining.start()
    joining.join(JOIN_TIMEOUT_S)
    if joining.is_alive():
        raise ReplicasUnavailable(SILENT.format(address=address, seconds=JOIN_TIMEOUT_S))
    if outcome:
        raise ReplicasUnavailable(JOIN_FAILED.format(address=address, why=last_line(outcome[0]))) from None


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) that `address` names, None for auto and local (Ray finds those itself); ValueError when it is
    no address."""
    if address in ("auto", "local"):
        return None
    parts = urlsplit(address if "://" in address else f"//{address}")
    if not parts.hostname:
        raise ValueError(address)
    return parts.hostname, parts.port or (CLIENT_PORT if parts.scheme == "ray" else GCS_PORT)


def check_reachable(address: str) -> None:
    """ReplicasUnavailable unless something accepts a TCP connection where `address` points."""
    try:
        target = host_port(address)
    except ValueError:
        raise ReplicasUnavailable(NOT_AN_ADDRESS.format(address=address)) from None
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else (error.strerror or str(error)).lower()
        raise ReplicasUnavailable(UNREACHABLE.format(address=address, reason=reason)) from None


def deploy(app, name: str, deployment: str, replicas: int, ready_timeout_s: float = READY_TIMEOUT_S):
    """Deploy the bound Serve application `app` as `name` and wait until it runs; its handle. ReplicasUnavailable
    when it fails to start (the replica's own error, in one line) or is not running within ready_timeout_s."""
    try:
        handle = serve.run_many(
            [serve.RunTarget(app, name=name, route_prefix=None)], wait_for_applications_running=False
        )[0]
    except Exception as error:
        raise ReplicasUnavailable(f"The engine replicas did not start: {last_line(error)}") from None
    deadline = time.monotonic() + ready_timeout_s
    while True:
        status = serve.status().applications.get(name)
        state = status.status if status is not None else None
        if state == ApplicationStatus.RUNNING:
            return handle
        if state in (ApplicationStatus.DEPLOY_FAILED, ApplicationStatus.UNHEALTHY):
            why = _deployment_message(status, deployment) or status.message
            raise ReplicasUnavailable(f"The engine replicas did not start: {last_line(why)}")
        if time.monotonic() > deadline:
            raise ReplicasUnavailable(NOT_READY.format(replicas=replicas, seconds=ready_timeout_s))
        time.sleep(0.5)


def _deployment_message(status, deployment: str) -> str:
    """The deployment's status message, which ends with the replica constructor's traceback ("" if none)."""
    found = status.deployments.get(deployment)
    return found.message if found is not None and found.message.strip() else ""


def last_line(error: BaseException | str) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
