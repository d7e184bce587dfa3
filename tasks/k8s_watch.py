"""Create or re-attach to a Kubernetes Job, watch it at a bounded rate, follow its pods' logs.

The Kubernetes side of the ``kubernetes`` launcher (:mod:`tasks.kubernetes`), on the ``kubernetes_asyncio`` client
(the one prefect-kubernetes uses). Rules, each one a failure seen on real clusters:

- **API errors are not job failures.** 429/5xx, connection errors and a 404 of a Job we just saw (an apiserver or
  watch-cache race) are retried with bounded exponential backoff (:class:`ApiRetry`); only after
  ``api_retry_window_s`` of consecutive errors does the attempt give up, *without* deleting the Job, so the next
  attempt re-attaches to it. A Job is deleted only when the launcher decided to stop it (timeout, pending timeout,
  cancellation, a stale Job of another pod template).
- **Bounded poll rate.** The Job and its pods are read once per ``poll_interval_s``, whatever state they are in.
- **Pods that cannot start fail fast, with the reason.** A pod's waiting reason (ImagePullBackOff,
  CreateContainerConfigError...), its PodScheduled message and its events (or the Job's events when no pod could be
  created: quota, Pod Security admission, a missing service account) go to the log as they change; after
  ``pending_timeout_s`` without a started container the Job is deleted and the attempt fails with that reason.
- **Re-attach, never relaunch.** A still-active Job of the same spec and pod template (a previous attempt whose flow
  pod died) is followed instead of being replaced; a Job of the same spec but another template, or a failed Job of
  the same name, is deleted and the new one created only after the old one is gone (foreground deletion: its pods
  are gone too).
- **Logs survive dropped streams.** Each pod's log is followed with ``timestamps=true``; when the stream ends while
  the container still runs, it is reopened with ``sinceTime`` at the last line seen, and lines already passed on are
  skipped (``sinceTime`` has one-second resolution).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.launchers.errors import JobLaunchError
from tasks.launchers.protocol import LineSink, clip_line
from tasks.launchers.request import LaunchOutcome

#: HTTP statuses of the Kubernetes API worth retrying (throttling, apiserver or etcd trouble).
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Label the Job controller puts on the pods of a Job.
JOB_NAME_LABEL = "job-name"
#: Name of the job container in the pod (tasks.kubernetes.build_job_manifest).
CONTAINER = "job"


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


# ------------------------------------------------------------------------------------------------- job state
def job_finished(job: dict) -> tuple[str, str] | None:
    """``("Complete" | "Failed", "reason: message")`` once the Job has that condition, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"], f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return None


def job_active(job: dict) -> bool:
    """Not finished and not being deleted."""
    return job_finished(job) is None and not (job.get("metadata") or {}).get("deletionTimestamp")


def container_state(pod: dict) -> dict:
    """``state`` of the job container (``{}`` before the kubelet reports it)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status.get("state") or {}
    return {}


def pod_started(pod: dict) -> bool:
    """The container runs or ran: its log can be read."""
    state = container_state(pod)
    return "running" in state or "terminated" in state


def exit_code(pods: list[dict]) -> int | None:
    """Exit code of the newest terminated job container, None if none terminated."""
    codes = [
        (p["metadata"].get("creationTimestamp") or "", container_state(p)["terminated"].get("exitCode"))
        for p in pods
        if "terminated" in container_state(p)
    ]
    return max(codes)[1] if codes else None


def pending_reason(pod: dict) -> str:
    """Why a pod's container has not started: waiting reason and message, else the PodScheduled condition."""
    waiting = container_state(pod).get("waiting")
    if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
        return f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip(": ")
    if waiting:
        return waiting["reason"]
    return (pod.get("status") or {}).get("phase") or "Pending"


def describe_events(events: dict, limit: int = 3) -> str:
    """The last ``limit`` Warning events (``reason: message``, repeats collapsed) of an event list."""
    items = [e for e in events.get("items") or [] if e.get("type") == "Warning"]
    items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    seen: list[str] = []
    for e in items:
        text = f"{e.get('reason', '')}: {e.get('message', '')}"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen[-limit:])


# ------------------------------------------------------------------------------------------ create / re-attach
#: Annotation of a Job: hash of its pod template (image, command, env, resources); equal hash = same job.
TEMPLATE_HASH_ANNOTATION = "mugrpo/template-hash"


def template_hash(job: dict) -> str:
    return ((job.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION, "")


async def delete_job(api: Any, namespace: str, name: str, retry: ApiRetry) -> None:
    """Delete a Job with foreground propagation (the Job object stays until its pods are gone); the pods get
    their termination grace period (SIGTERM through tini, then SIGKILL). A Job already gone is fine."""
    from kubernetes_asyncio.client import BatchV1Api, V1DeleteOptions

    batch = BatchV1Api(api)
    await retry.call(
        f"delete Job {namespace}/{name}",
        lambda: fetch(
            batch.delete_namespaced_job(
                name, namespace, body=V1DeleteOptions(propagation_policy="Foreground"), _preload_content=False
            )
        ),
        not_found_ok=True,
    )


async def wait_gone(api: Any, namespace: str, name: str, retry: ApiRetry, timing: WatchSettings) -> None:
    """Poll until the Job (and, foreground deletion, its pods) no longer exists.

    Raises:
        JobLaunchError: still there after ``timing.delete_wait_s``.
    """
    from kubernetes_asyncio.client import BatchV1Api

    batch = BatchV1Api(api)
    end = time.monotonic() + timing.delete_wait_s
    while True:
        job = await retry.call(
            f"read Job {namespace}/{name}",
            lambda: fetch(batch.read_namespaced_job(name, namespace, _preload_content=False)),
            not_found_ok=True,
        )
        if job is None:
            return
        if time.monotonic() >= end:
            raise JobLaunchError(
                f"Kubernetes Job {namespace}/{name} still exists {timing.delete_wait_s:g} s after its deletion",
                kind=retry.kind,
            )
        await asyncio.sleep(timing.poll_interval_s)


async def ensure_job(
    api: Any, manifest: dict, spec_selector: str, retry: ApiRetry, timing: WatchSettings, on_line: LineSink
) -> str:
    """Create the Job of ``manifest`` unless a Job of the same spec can be re-attached; returns the Job's name.

    - An active or succeeded Job of the same spec (``spec_selector``) and pod template: re-attach (no new Job).
    - An active Job of the same spec but another pod template, a Job being deleted, or a failed Job of the wanted
      name: delete it and wait until it is gone (so two pods never write a stage's files at once), then create.
    - Another flow run creating the same name at the same moment (409 Conflict): re-attach to its Job.

    Raises:
        JobLaunchError: the API refused the Job (e.g. 403, 422) or kept failing.
    """
    from kubernetes_asyncio.client import BatchV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    batch = BatchV1Api(api)
    meta = manifest["metadata"]
    namespace, name, wanted = meta["namespace"], meta["name"], template_hash(manifest)
    listed = await retry.call(
        f"list Jobs of {spec_selector}",
        lambda: fetch(batch.list_namespaced_job(namespace, label_selector=spec_selector, _preload_content=False)),
    )
    jobs = sorted(listed.get("items") or [], key=lambda j: j["metadata"].get("creationTimestamp") or "")
    for job in jobs:
        other = job["metadata"]["name"]
        finished = job_finished(job)
        if template_hash(job) == wanted and (job_active(job) or (finished and finished[0] == "Complete")):
            state = "running" if job_active(job) else "succeeded"
            on_line(f"re-attaching to the {state} Kubernetes Job {namespace}/{other} of the same spec")
            return other
    for job in jobs:
        other = job["metadata"]["name"]
        if job_active(job) or job["metadata"].get("deletionTimestamp") or other == name:
            on_line(f"deleting Kubernetes Job {namespace}/{other} of the same spec and waiting until it is gone")
            await delete_job(api, namespace, other, retry)
            await wait_gone(api, namespace, other, retry, timing)

    async def create() -> Any:
        try:
            return await fetch(batch.create_namespaced_job(namespace, body=manifest, _preload_content=False))
        except ApiException as e:
            if e.status == 409:  # created meanwhile by another flow run of this run id
                return None
            raise

    created = await retry.call(f"create Job {namespace}/{name}", create)
    if created is None:
        on_line(f"Kubernetes Job {namespace}/{name} exists already (another attempt created it): re-attaching")
    else:
        on_line(f"created Kubernetes Job {namespace}/{name}")
    return name


async def ensure_service(
    api: Any, manifest: dict, service_for: Callable[[str | None], dict], retry: ApiRetry, on_line: LineSink
) -> None:
    """Create the headless rendezvous Service of the multi-node Job ``manifest`` (already created or re-attached:
    the Service is owned by it, so it goes when the Job goes); one that exists already (409) is kept.
    ``service_for(job_uid)`` builds the Service's manifest (:func:`tasks.kubernetes.build_rendezvous_service`).

    Raises:
        JobLaunchError: the API refused the Service or kept failing.
    """
    from kubernetes_asyncio.client import BatchV1Api, CoreV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    meta = manifest["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    batch, core = BatchV1Api(api), CoreV1Api(api)
    job = await retry.call(
        f"read Job {namespace}/{name}",
        lambda: fetch(batch.read_namespaced_job(name, namespace, _preload_content=False)),
    )
    service = service_for(job["metadata"].get("uid"))

    async def create() -> Any:
        try:
            return await fetch(core.create_namespaced_service(namespace, body=service, _preload_content=False))
        except ApiException as e:
            if e.status == 409:  # a previous attempt (or another flow run) created it
                return None
            raise

    created = await retry.call(f"create Service {namespace}/{name}", create)
    state = "created" if created is not None else "kept the existing"
    on_line(f"{state} headless Service {namespace}/{name} for the rendezvous of the multi-node Job")


# -------------------------------------------------------------------------------------------------------- logs
def ts_key(ts: str) -> str:
    """Sort key of an RFC 3339 UTC timestamp with a trimmed fraction (Go's RFC3339Nano: ``...:05.1Z`` comes
    before ``...:05.12Z``, which plain string order gets wrong)."""
    base, _, frac = ts.rstrip("Z").partition(".")
    return f"{base}.{frac.ljust(9, '0')}"


@dataclass
class LogCursor:
    """Where a pod's log was left: the timestamp of the last line passed on, how many lines carried it, and how
    many lines of that timestamp the current stream has replayed (``sinceTime`` has one-second resolution)."""

    last_ts: str = ""
    at_last: int = 0
    replayed: int = 0
    final_read: bool = False
    done: bool = False

    def since_time(self) -> str | None:
        """``sinceTime`` for a reopened stream: the last timestamp cut to whole seconds (the API's resolution)."""
        return self.last_ts[:19] + "Z" if self.last_ts else None

    def reopen(self) -> None:
        """A new stream starts: lines of the last timestamp are replayed from the first."""
        self.replayed = 0

    def accept(self, ts: str) -> bool:
        """Whether a line stamped ``ts`` (the kubelet's RFC 3339 UTC, fraction trimmed) was not passed on yet."""
        if not self.last_ts or ts_key(ts) > ts_key(self.last_ts):
            self.last_ts, self.at_last, self.replayed = ts, 1, 1
            return True
        if ts_key(ts) == ts_key(self.last_ts):
            self.replayed += 1
            if self.replayed > self.at_last:
                self.at_last += 1
                return True
        return False


@dataclass
class JobWatch:
    """Everything one watch of one Job needs; :meth:`run` returns the outcome."""

    api: Any  # kubernetes_asyncio ApiClient
    namespace: str
    job_name: str
    kind: str
    on_line: LineSink
    timing: WatchSettings
    timeout_s: float
    retry: ApiRetry
    cursors: dict[str, LogCursor] = field(default_factory=dict)
    followers: dict[str, asyncio.Task] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return f"{self.namespace}/{self.job_name}"

    async def read_job(self) -> dict | None:
        from kubernetes_asyncio.client import BatchV1Api

        batch = BatchV1Api(self.api)
        return await self.retry.call(
            f"read Job {self.job_id}",
            lambda: fetch(batch.read_namespaced_job(self.job_name, self.namespace, _preload_content=False)),
            not_found_ok=True,
        )

    async def list_pods(self) -> list[dict]:
        from kubernetes_asyncio.client import CoreV1Api

        core = CoreV1Api(self.api)
        pods = (
            await self.retry.call(
                f"list pods of Job {self.job_id}",
                lambda: fetch(
                    core.list_namespaced_pod(
                        self.namespace, label_selector=f"{JOB_NAME_LABEL}={self.job_name}", _preload_content=False
                    )
                ),
            )
        ).get("items") or []
        return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    async def events_of(self, name: str) -> str:
        from kubernetes_asyncio.client import CoreV1Api

        core = CoreV1Api(self.api)
        events = await self.retry.call(
            f"list events of {name}",
            lambda: fetch(
                core.list_namespaced_event(
                    self.namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
                )
            ),
        )
        return describe_events(events)

    async def follow(self, pod_name: str) -> None:
        """Pass the pod's log lines to ``on_line``, reopening dropped streams at the last line seen, until the
        container has terminated and its stream ended."""
        cursor = self.cursors.setdefault(pod_name, LogCursor())
        while not cursor.done:
            query = [("container", CONTAINER), ("follow", "true"), ("timestamps", "true")]
            if cursor.since_time():
                query.append(("sinceTime", cursor.since_time()))
            cursor.reopen()
            try:
                resp = await self.api.call_api(
                    "/api/v1/namespaces/{namespace}/pods/{name}/log",
                    "GET",
                    {"namespace": self.namespace, "name": pod_name},
                    query,
                    {"Accept": "text/plain"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=(30, self.timing.log_idle_reconnect_s),
                )
                try:
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
                    async for raw in resp.content:
                        ts, _, text = raw.decode("utf-8", "replace").rstrip("\r\n").partition(" ")
                        if cursor.accept(ts):
                            self.on_line(clip_line(text))
                finally:
                    resp.release()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  a dropped or refused stream: reopen after a poll interval
                self.on_line(f"log stream of pod {pod_name} broke ({type(e).__name__}: {e}); reopening")
            # The stream ended: done if the container terminated, else it was dropped and is reopened.
            try:
                pods = {p["metadata"]["name"]: p for p in await self.list_pods()}
            except JobLaunchError as e:  # the API is down for good: the watch loop reports it, logs stop here
                self.on_line(f"stopped following pod {pod_name}: {e}")
                return
            pod = pods.get(pod_name)
            if pod is None or "terminated" in container_state(pod):
                if pod is not None and not cursor.final_read:
                    cursor.final_read = True  # one more read catches lines written after a drop, before exit
                    continue
                cursor.done = True
            else:
                await asyncio.sleep(self.timing.poll_interval_s)

    async def stop(self, why: str) -> None:
        """Delete the Job (we decided to stop it: ``why``) and stop following its logs."""
        self.on_line(f"deleting Kubernetes Job {self.job_id}: {why}")
        await delete_job(self.api, self.namespace, self.job_name, self.retry)
        await self.drain_logs(timeout_s=3 * self.timing.poll_interval_s)

    async def drain_logs(self, timeout_s: float | None = None) -> None:
        """Let the log followers finish (their containers ended) for up to ``timeout_s`` (default: the larger of
        5 s and three poll intervals), then stop them."""
        if timeout_s is None:
            timeout_s = max(5.0, 3 * self.timing.poll_interval_s)
        if self.followers:
            await asyncio.wait(self.followers.values(), timeout=timeout_s)
        for task in self.followers.values():
            task.cancel()

    async def why_pending(self, pods: list[dict]) -> str | None:
        """Why no container of the Job runs (the newest waiting pod's reason and events, or the Job's events when
        no pod exists); None when one runs or the pods are past pending."""
        if any("running" in container_state(p) for p in pods):
            return None
        waiting = [p for p in pods if not pod_started(p) and (p.get("status") or {}).get("phase") == "Pending"]
        if waiting:
            pod = waiting[-1]["metadata"]["name"]
            why, events = f"pod {pod}: {pending_reason(waiting[-1])}", await self.events_of(pod)
        elif not pods:
            why, events = "no pod created yet", await self.events_of(self.job_name)
        else:
            return None
        return why + (f"; events: {events}" if events else "")

    def outcome(self, finished: tuple[str, str], pods: list[dict]) -> LaunchOutcome:
        """The outcome of a finished Job (``DeadlineExceeded``: the cluster killed it at its deadline)."""
        status, why = finished
        if status == "Complete":
            return LaunchOutcome(exit_code=0, job_id=self.job_id)
        return LaunchOutcome(
            exit_code=exit_code(pods),
            job_id=self.job_id,
            timed_out="DeadlineExceeded" in why,
            detail=f"Job failed: {why}",
        )

    async def run(self) -> LaunchOutcome:
        """Poll the Job and its pods every ``poll_interval_s`` until it finishes, times out or never starts; follow
        each started pod's log meanwhile.

        Raises:
            JobLaunchError: the API kept failing, or the Job vanished (deleted by someone else).
        """
        deadline = time.monotonic() + self.timeout_s
        pending_since: float | None = None
        said, missing = "", 0
        while True:
            job = await self.read_job()
            if job is None:
                missing += 1  # a 404 right after create or re-attach can be an apiserver cache race
                if missing > 3:
                    await self.drain_logs()
                    raise JobLaunchError(f"Kubernetes Job {self.job_id} disappeared (deleted?)", kind=self.kind)
                self.on_line(f"Kubernetes Job {self.job_id} not found; checking again")
                await asyncio.sleep(self.timing.poll_interval_s)
                continue
            missing = 0
            pods = await self.list_pods()
            for pod in pods:
                name = pod["metadata"]["name"]
                if pod_started(pod) and name not in self.followers:
                    self.followers[name] = asyncio.ensure_future(self.follow(name))
            finished = job_finished(job)
            if finished is not None:
                await self.drain_logs()
                return self.outcome(finished, pods)
            pending = await self.why_pending(pods)
            if pending is None:
                pending_since, said = None, ""
            else:
                pending_since = pending_since or time.monotonic()
                if pending != said:  # log a reason once, when it changes
                    self.on_line(f"waiting for Kubernetes Job {self.job_id}: {pending}")
                    said = pending
                if time.monotonic() - pending_since >= self.timing.pending_timeout_s:
                    limit = f"{self.timing.pending_timeout_s:g} s"
                    await self.stop(f"no container started within {limit}")
                    detail = f"no container started within the pending timeout of {limit}; {pending}"
                    return LaunchOutcome(exit_code=None, job_id=self.job_id, detail=detail)
            if time.monotonic() >= deadline:
                await self.stop(f"past its timeout of {self.timeout_s:g} s")
                return LaunchOutcome(exit_code=None, job_id=self.job_id, timed_out=True)
            await asyncio.sleep(self.timing.poll_interval_s)
