"""The ``kubernetes`` launcher (:class:`KubernetesLauncher`): creates a job's Kubernetes Job, or re-attaches to one a
dead flow pod left running, and watches it to its end; Jobs created ahead (pre-started) until a run re-attaches."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Mapping
from typing import Any

from tasks.kubernetes.api import ApiRetry, WatchSettings, api_client
from tasks.kubernetes.commands import job_nodes
from tasks.kubernetes.manifests import build_job_manifest, build_rendezvous_service
from tasks.kubernetes.names import SPEC_LABEL
from tasks.kubernetes.objects import delete_job, ensure_job, ensure_service
from tasks.kubernetes.settings import KubernetesJobSettings
from tasks.kubernetes.watch import JobWatch
from tasks.launchers.errors import JobLaunchError
from tasks.launchers.protocol import Launcher, LineSink, register_launcher
from tasks.launchers.request import JobRequest, LaunchOutcome

#: Jobs created ahead by :meth:`KubernetesLauncher.prestart` that no run re-attached to yet: request identity ->
#: (namespace, Job name, labels).
_PRESTARTED: dict[tuple, tuple[str, str, dict[str, str]]] = {}
_PRESTART_LOCK = threading.Lock()


@register_launcher("kubernetes")
class KubernetesLauncher(Launcher):
    """Run the job as a Kubernetes Job (manifest from :func:`build_job_manifest`), watched by
    :mod:`tasks.kubernetes.watch` on the ``kubernetes_asyncio`` client; pod log lines stream to ``on_line``.
    Credentials for the Kubernetes API: in-cluster (the flow pod's service account, RBAC in infra/k8s/rbac.yaml)
    when ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig (``KUBECONFIG``).

    A Job outlives the flow pod that created it (a hard-killed flow pod cannot clean up), and its name is
    deterministic (:func:`job_name`): a resumed attempt re-attaches to a still-running Job of the same spec and
    pod template and follows its logs instead of relaunching; a Job it has to replace is deleted first and the new
    one created only once the old one and its pods are gone. The launcher deletes a Job only when it decided to
    stop it: timeout, pending timeout, cancellation of the task, or replacement. API errors never do. A pod evicted
    while its Job runs (condition ``DisruptionTarget``) is replaced by the Job controller and the watch follows the
    replacement (:mod:`tasks.kubernetes.watch`); the pods get the job's grace (``MUGRPO_STOP_GRACE_S``) as their
    ``terminationGracePeriodSeconds``.

    Args:
        settings: where and how pods run; None = :meth:`KubernetesJobSettings.from_env`.
        **overrides: fields of :class:`KubernetesJobSettings` replacing those of ``settings``.
    """

    def __init__(self, settings: KubernetesJobSettings | None = None, **overrides: Any):
        base = settings or KubernetesJobSettings.from_env()
        self.settings = KubernetesJobSettings.model_validate({**base.model_dump(), **overrides})

    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        """Create or re-attach to the Job, follow it to its end (see :class:`KubernetesLauncher`).

        Raises:
            JobLaunchError: the API refused the Job, kept failing for ``api_retry_window_s``, or the Job vanished.
        """
        try:
            import kubernetes_asyncio  # noqa: F401
        except ImportError as e:
            raise JobLaunchError(
                "the kubernetes launcher needs the kubernetes_asyncio package (pip install 'mugrpo[kubernetes]')",
                kind=request.kind,
            ) from e
        with _PRESTART_LOCK:
            _PRESTARTED.pop(request.identity, None)  # a Job created ahead: re-attached to below
        manifest = build_job_manifest(request, self.settings)
        attached: dict[str, str] = {}
        try:
            return _run_coro(self._launch(request, manifest, on_line, attached))
        except JobLaunchError:
            raise  # the Job (if any) is left running: the next attempt re-attaches to it
        except Exception as e:  # noqa: BLE001  an unexpected answer of the API; same: re-attach later
            raise JobLaunchError(
                f"watching Kubernetes Job {attached or manifest['metadata']['name']}: {e!r}", kind=request.kind
            ) from e
        except BaseException:  # cancellation, interrupt: the job must not outlive the task that launched it
            if "name" in attached:
                on_line(f"deleting Kubernetes Job {self.settings.namespace}/{attached['name']}: task interrupted")
                _run_coro(self._delete(request, attached["name"], on_line))
            raise

    def prestart(self, request: JobRequest) -> bool:
        """Create the Job now: its pod is scheduled, pulls its image and starts the job, which gets ready and waits
        at its start gate (the spec's ``start_after``); :meth:`run` of the same request then re-attaches to it
        (:func:`tasks.kubernetes.objects.ensure_job`: same spec, same pod template). Not for a multi-node job,
        whose rendezvous Service is created with it at :meth:`run`. The Job's ``activeDeadlineSeconds`` counts
        from its creation, so its wait is part of ``timeout_s``.

        Raises:
            JobLaunchError: the API refused the Job or kept failing.
        """
        if job_nodes(request.kind, self.settings) > 1:
            return False
        manifest = build_job_manifest(request, self.settings)
        name = _run_coro(self._create(request, manifest))
        with _PRESTART_LOCK:
            _PRESTARTED[request.identity] = (self.settings.namespace, name, dict(request.labels))
        return True

    def discard_prestarted(self, labels: Mapping[str, str] | None = None) -> int:
        """Delete the Jobs created by :meth:`prestart` that no run re-attached to (whose labels include
        ``labels``; all when None)."""
        with _PRESTART_LOCK:
            doomed = [
                key
                for key, (_, _, job_labels) in _PRESTARTED.items()
                if labels is None or all(job_labels.get(k) == v for k, v in labels.items())
            ]
            jobs = [_PRESTARTED.pop(key) for key in doomed]
        for namespace, name, _ in jobs:
            req = JobRequest(kind="job", spec_url=name, timeout_s=1.0)
            _run_coro(self._delete(req, name, lambda line: None, namespace))
        return len(jobs)

    async def _create(self, request: JobRequest, manifest: dict) -> str:
        timing, retry = self._timing(), self._retry(request, lambda line: None)
        selector = f"{SPEC_LABEL}={manifest['metadata']['labels'][SPEC_LABEL]}"
        async with await api_client() as api:
            return await ensure_job(api, manifest, selector, retry, timing, lambda line: None)

    def _timing(self) -> Any:
        s = self.settings
        return WatchSettings(
            poll_interval_s=s.poll_interval_s,
            pending_timeout_s=s.pending_timeout_s,
            api_retry_window_s=s.api_retry_window_s,
            api_backoff_max_s=s.api_backoff_max_s,
            delete_wait_s=s.delete_wait_s,
        )

    def _retry(self, request: JobRequest, on_line: LineSink) -> Any:
        s = self.settings
        return ApiRetry(window_s=s.api_retry_window_s, max_s=s.api_backoff_max_s, kind=request.kind, on_line=on_line)

    async def _launch(self, request: JobRequest, manifest: dict, on_line: LineSink, attached: dict) -> LaunchOutcome:
        timing, retry = self._timing(), self._retry(request, on_line)
        selector = f"{SPEC_LABEL}={manifest['metadata']['labels'][SPEC_LABEL]}"
        async with await api_client() as api:
            attached["name"] = await ensure_job(api, manifest, selector, retry, timing, on_line)
            if manifest["spec"].get("completionMode") == "Indexed":  # multi-node: the rendezvous DNS
                named = {**manifest, "metadata": {**manifest["metadata"], "name": attached["name"]}}
                await ensure_service(
                    api, named, lambda uid: build_rendezvous_service(named, owner_uid=uid), retry, on_line
                )
            watch = JobWatch(
                api=api,
                namespace=self.settings.namespace,
                job_name=attached["name"],
                kind=request.kind,
                on_line=on_line,
                timing=timing,
                # The cluster enforces the deadline (activeDeadlineSeconds); this one bounds the watch loop.
                timeout_s=request.timeout_s + 5 * self.settings.poll_interval_s,
                retry=retry,
            )
            try:
                return await watch.run()
            finally:
                for task in watch.followers.values():
                    task.cancel()

    async def _delete(self, request: JobRequest, name: str, on_line: LineSink, namespace: str | None = None) -> None:
        retry = ApiRetry(window_s=10.0, max_s=2.0, kind=request.kind, on_line=on_line)
        async with await api_client() as api:
            try:
                await delete_job(api, namespace or self.settings.namespace, name, retry)
            except JobLaunchError as e:
                on_line(f"could not delete Kubernetes Job {name}: {e}")


def _run_coro(coro: Any) -> Any:
    """Run ``coro`` to its end from sync code: on this thread (no event loop runs here), else on a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
