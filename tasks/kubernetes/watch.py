"""Watch a Kubernetes Job at a bounded rate and follow its pods' logs, until it finishes, times out or never starts
(:class:`JobWatch`).

- **Bounded poll rate.** The Job and its pods are read once per ``poll_interval_s``, whatever state they are in.
- **Pods that cannot start fail fast, with the reason.** A pod's waiting reason (ImagePullBackOff,
  CreateContainerConfigError...), its PodScheduled message and its events (or the Job's events when no pod could be
  created: quota, Pod Security admission, a missing service account) go to the log as they change; after
  ``pending_timeout_s`` without a started container the Job is deleted and the attempt fails with that reason.
- **An evicted pod is a preemption, not a failure.** A pod with the condition ``DisruptionTarget`` (an eviction, a
  node drain, a scheduler preemption) got its SIGTERM and ``terminationGracePeriodSeconds``: the job saves the
  update in flight and exits 75 (:mod:`mugrpo.common.preemption`). While the Job is active its ``podFailurePolicy``
  ignores that failure and the Job controller creates a replacement pod, which resumes from the saved work: the
  watch says so once per pod, follows the replacement's log and ends with the Job's result. A Job that fails after
  an eviction names it in its outcome (exit code 75: :class:`~tasks.launchers.errors.JobPreemptedError`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tasks.kubernetes.api import ApiRetry, WatchSettings, fetch
from tasks.kubernetes.logs import LogCursor
from tasks.kubernetes.objects import delete_job
from tasks.kubernetes.state import (
    CONTAINER,
    JOB_NAME_LABEL,
    container_state,
    describe_events,
    disruption,
    exit_code,
    job_finished,
    pending_reason,
    pod_started,
)
from tasks.launchers.errors import JobLaunchError
from tasks.launchers.protocol import LineSink, clip_line
from tasks.launchers.request import LaunchOutcome


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
    #: Pods seen with the condition DisruptionTarget: name -> its reason.
    evicted: dict[str, str] = field(default_factory=dict)

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

    def note_evictions(self, pods: list[dict], *, active: bool) -> None:
        """Record the pods newly seen with the condition ``DisruptionTarget``; while the Job is ``active`` (its
        controller replaces such a pod), say so once per pod."""
        for pod in pods:
            name, reason = pod["metadata"]["name"], disruption(pod)
            if reason is None or name in self.evicted:
                continue
            self.evicted[name] = reason
            if active:
                replaced = "the Job controller replaces it; the job resumes from its saved work"
                self.on_line(f"pod {name} evicted ({reason}); {replaced}")

    def outcome(self, finished: tuple[str, str], pods: list[dict]) -> LaunchOutcome:
        """The outcome of a finished Job (``DeadlineExceeded``: the cluster killed it at its deadline); a failed
        Job's detail names the pods evicted on the way."""
        status, why = finished
        if status == "Complete":
            return LaunchOutcome(exit_code=0, job_id=self.job_id)
        evictions = "".join(f"; pod {name} evicted ({reason})" for name, reason in self.evicted.items())
        return LaunchOutcome(
            exit_code=exit_code(pods),
            job_id=self.job_id,
            timed_out="DeadlineExceeded" in why,
            detail=f"Job failed: {why}{evictions}",
        )

    async def run(self) -> LaunchOutcome:
        """Poll the Job and its pods every ``poll_interval_s`` until it finishes, times out or never starts; follow
        each started pod's log meanwhile (a replacement of an evicted pod's too: :meth:`note_evictions`).

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
            self.note_evictions(pods, active=finished is None)
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
