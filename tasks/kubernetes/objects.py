"""Create, re-attach to and delete a job's Kubernetes Job, and create a multi-node Job's rendezvous Service.

- **Re-attach, never relaunch.** A still-active Job of the same spec and pod template (a previous attempt whose flow
  pod died) is followed instead of being replaced; a Job of the same spec but another template, or a failed Job of
  the same name, is deleted and the new one created only after the old one is gone (foreground deletion: its pods
  are gone too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tasks.kubernetes.api import ApiRetry, WatchSettings, fetch
from tasks.kubernetes.state import job_active, job_finished
from tasks.launchers.errors import JobLaunchError
from tasks.launchers.protocol import LineSink

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
    ``service_for(job_uid)`` builds the Service's manifest
    (:func:`tasks.kubernetes.manifests.build_rendezvous_service`).

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
