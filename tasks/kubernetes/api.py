"""Calls to the Kubernetes API on the ``kubernetes_asyncio`` client (the one prefect-kubernetes uses): the client
(:func:`api_client`), the retry policy of a call (:class:`ApiRetry`), a call's body (:func:`fetch`) and the timing
of the watch loop (:class:`WatchSettings`).

- **API errors are not job failures.** 429/5xx, connection errors and a 404 of a Job we just saw (an apiserver or
  watch-cache race) are retried with bounded exponential backoff (:class:`ApiRetry`); only after
  ``api_retry_window_s`` of consecutive errors does the attempt give up, *without* deleting the Job, so the next
  attempt re-attaches to it. A Job is deleted only when the launcher decided to stop it (timeout, pending timeout,
  cancellation, a stale Job of another pod template).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tasks.launchers.errors import JobLaunchError
from tasks.launchers.protocol import LineSink

#: HTTP statuses of the Kubernetes API worth retrying (throttling, apiserver or etcd trouble).
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class WatchSettings:
    """Timing of the watch loop (seconds)."""

    poll_interval_s: float = 10.0
    pending_timeout_s: float = 1200.0
    api_retry_window_s: float = 300.0
    api_backoff_max_s: float = 30.0
    delete_wait_s: float = 600.0
    log_idle_reconnect_s: float = 300.0


class ApiGone(Exception):
    """The object was not found (404) for longer than a watch race lasts."""


@dataclass
class ApiRetry:
    """Retry policy of one API call: transient errors back off as ``min(max_s, 0.5 * 2**n)`` (with jitter) until
    ``window_s`` of consecutive failures has passed, then the last error is raised as :class:`JobLaunchError`."""

    window_s: float
    max_s: float
    kind: str
    on_line: LineSink

    async def call(self, what: str, fn: Callable[[], Awaitable[Any]], *, not_found_ok: bool = False) -> Any:
        """Run ``fn()`` until it succeeds. With ``not_found_ok`` a 404 returns None at once.

        Raises:
            JobLaunchError: a non-transient API error, or transient ones for longer than ``window_s``.
        """
        from kubernetes_asyncio.client.exceptions import ApiException

        start, attempt = time.monotonic(), 0
        while True:
            try:
                return await fn()
            except ApiException as e:
                if e.status == 404 and not_found_ok:
                    return None
                if e.status not in TRANSIENT_STATUSES:
                    raise JobLaunchError(f"Kubernetes API: {what} failed: {e.status} {e.reason}", kind=self.kind) from e
                err: BaseException = e
                text = f"{e.status} {e.reason}"
            except (TimeoutError, OSError, _client_error()) as e:
                err, text = e, f"{type(e).__name__}: {e}"
            waited = time.monotonic() - start
            if waited >= self.window_s:
                raise JobLaunchError(
                    f"Kubernetes API: {what} kept failing for {waited:.0f} s (last: {text}); the Job was left "
                    "running and the next attempt re-attaches to it",
                    kind=self.kind,
                ) from err
            delay = min(self.max_s, 0.5 * 2**attempt) * random.uniform(0.8, 1.0)
            self.on_line(f"Kubernetes API: {what}: {text}; retrying in {delay:.1f} s")
            await asyncio.sleep(delay)
            attempt += 1


def _client_error() -> type[BaseException]:
    import aiohttp

    return aiohttp.ClientError


async def fetch(call: Awaitable[Any]) -> dict:
    """Body of a ``_preload_content=False`` call as a dict (plain dicts keep the API's camelCase field names).

    Raises:
        ApiException: a non-2xx answer (the client raises it only when it preloads the body).
    """
    from kubernetes_asyncio.client.exceptions import ApiException

    resp = await call
    try:
        body = await resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=body.decode("utf-8", "replace")[:500] or resp.reason)
        return json.loads(body)
    finally:
        resp.release()


async def api_client() -> Any:
    """A ``kubernetes_asyncio`` ApiClient: in-cluster config when ``KUBERNETES_SERVICE_HOST`` is set (a pod),
    else the kubeconfig (``KUBECONFIG`` or ``~/.kube/config``)."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:  # read KUBECONFIG now: the client reads it once, at import
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return client.ApiClient(configuration=configuration)
