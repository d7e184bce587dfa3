"""The ``kubernetes`` launcher: each job runs as a Kubernetes Job in the image of its kind.

:func:`build_job_manifest` turns a :class:`~tasks.launchers.JobRequest` into a ``batch/v1`` Job (image, command,
GPU limits, node selector and tolerations, S3 credentials from a Secret through ``secretKeyRef``, an HF-cache
volume); :class:`KubernetesLauncher` creates it and follows its pod's logs with prefect-kubernetes' job helpers.
Where and how pods run comes from :class:`KubernetesJobSettings`, which the flow pod reads from its environment
(set by the work pool's base job template, infra/base-job-template.json).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.launchers import JobLaunchError, JobRequest, Launcher, LaunchOutcome, LineSink, clip_line, register_launcher

#: Environment variable holding a JSON object of :class:`KubernetesJobSettings` fields (set on the flow's pod).
K8S_SETTINGS_ENV = "MUGRPO_K8S_JOB_SETTINGS"
#: Single-field overrides, set by the work pool's base job template (infra/base-job-template.json).
K8S_FIELD_ENV = {
    "namespace": "MUGRPO_K8S_NAMESPACE",
    "image": "MUGRPO_K8S_IMAGE",
    "s3_secret_name": "MUGRPO_K8S_S3_SECRET",
    "hf_cache_claim_name": "MUGRPO_K8S_HF_CACHE_CLAIM",
    "service_account_name": "MUGRPO_K8S_SERVICE_ACCOUNT",
}
#: Label of a Job naming its spec (sha256 of the spec URL, 16 hex): one active Job per spec.
SPEC_LABEL = "mugrpo/spec"
_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


class KubernetesJobSettings(BaseModel):
    """Where and how job pods run on Kubernetes. Load with :meth:`from_env` on the flow's pod."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field("default", description="Namespace of the job's Kubernetes Job (the flow pod's own).")
    image: str | None = Field(None, description="Image of every job kind not listed in `images`.")
    images: dict[str, str] = Field(
        default_factory=dict, description="Image per job kind, e.g. {generate: REGISTRY/mugrpo:gpu} (vLLM image)."
    )
    image_pull_policy: str = Field("IfNotPresent", description="Kubernetes imagePullPolicy of job containers.")
    gpus: dict[str, int] = Field(
        default_factory=lambda: {"generate": 1},
        description="nvidia.com/gpu limit per job kind (kinds not listed get no GPU).",
    )
    resources: dict[str, dict[str, dict[str, str]]] = Field(
        default_factory=dict,
        description="Extra container resources per job kind, e.g. {train: {requests: {cpu: '8', memory: 64Gi}}}.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of every job pod.")
    gpu_node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Extra nodeSelector of GPU job pods, e.g. {cloud.google.com/gke-accelerator: nvidia-h100-80gb}.",
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations of every job pod.")
    gpu_tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="Extra tolerations of GPU job pods (GPU node pools are usually tainted nvidia.com/gpu).",
    )
    s3_secret_name: str | None = Field(
        "mugrpo-s3",
        description="Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, exposed to the job as env through "
        "secretKeyRef; None = rely on workload identity (IRSA, GKE Workload Identity).",
    )
    s3_secret_keys: tuple[str, ...] = Field(
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), description="Keys of the Secret, each exposed as that env var."
    )
    hf_cache_claim_name: str | None = Field(
        "mugrpo-hf-cache",
        description="PersistentVolumeClaim (ReadWriteMany) mounted as the HF cache; None = an emptyDir per pod.",
    )
    hf_cache_mount_path: str = Field("/cache/huggingface", description="Mount path of the HF cache; HF_HOME.")
    shm_size: str | None = Field(
        "16Gi", description="Size of the memory-backed /dev/shm of GPU jobs (vLLM, NCCL); None = the runtime default."
    )
    service_account_name: str | None = Field(None, description="serviceAccountName of job pods.")
    ttl_seconds_after_finished: int = Field(86400, ge=0, description="Kubernetes deletes finished Jobs after this.")
    poll_interval_s: int = Field(10, ge=1, description="Seconds between status polls of a running Job.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra plain env of every job pod (e.g. AWS_DEFAULT_REGION); no secrets."
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KubernetesJobSettings:
        """Settings from ``MUGRPO_K8S_JOB_SETTINGS`` (a JSON object, or the Python repr of a dict as the work pool
        template writes its ``job_settings`` variable) overlaid with the single-field variables of
        :data:`K8S_FIELD_ENV` (empty values are ignored).

        Raises:
            ValueError: the JSON is malformed or names an unknown field (the message names the variable).
        """
        environ = os.environ if environ is None else environ
        raw = environ.get(K8S_SETTINGS_ENV, "").strip()
        try:
            data = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            try:  # Prefect's job templates write an object variable as its Python repr
                data = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                raise ValueError(f"{K8S_SETTINGS_ENV} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"{K8S_SETTINGS_ENV} must hold a JSON object, got {type(data).__name__}")
        for name, var in K8S_FIELD_ENV.items():
            if environ.get(var):
                data[name] = environ[var]
        return cls.model_validate(data)

    def image_for(self, kind: str) -> str:
        """The image of job kind ``kind``.

        Raises:
            ValueError: neither ``images[kind]`` nor ``image`` is set.
        """
        image = self.images.get(kind) or self.image
        if not image:
            raise ValueError(
                f"no image for the {kind} job: set {K8S_FIELD_ENV['image']} (the work pool's `image` variable) or "
                f"'images' in {K8S_SETTINGS_ENV}"
            )
        return image


def k8s_name(*parts: str, max_len: int = 63) -> str:
    """A DNS-1123 label from ``parts`` (lowercase alphanumerics and '-', <= ``max_len`` chars)."""
    name = _DNS_LABEL_BAD.sub("-", "-".join(parts).lower()).strip("-")
    return name[:max_len].rstrip("-") or "job"


def k8s_label_value(value: str) -> str:
    """A valid label value (<= 63 chars of ``[A-Za-z0-9_.-]``, alphanumeric at both ends)."""
    return _LABEL_VALUE_BAD.sub("-", value)[:63].strip("-_.")


def build_job_manifest(request: JobRequest, settings: KubernetesJobSettings, name: str | None = None) -> dict:
    """The ``batch/v1`` Job manifest (a plain dict) that runs ``request`` in its image.

    One container runs ``request.command("python")``; ``activeDeadlineSeconds`` enforces the timeout inside the
    cluster; ``backoffLimit: 0`` leaves retries to Prefect (task retries) so every attempt is visible there.
    S3 credentials come from ``settings.s3_secret_name`` through ``secretKeyRef`` (never from flow parameters or
    the image); the HF cache is a volume at ``settings.hf_cache_mount_path`` (``HF_HOME``).

    Args:
        name: Job name; default ``mugrpo-{kind}-{8 hex}``.

    Raises:
        ValueError: no image for the job kind.
    """
    kind = request.kind
    name = name or k8s_name("mugrpo", kind, uuid.uuid4().hex[:8])
    gpus = settings.gpus.get(kind, 0)
    labels = {
        "app.kubernetes.io/name": "mugrpo",
        "app.kubernetes.io/component": k8s_label_value(kind),
        SPEC_LABEL: hashlib.sha256(request.spec_url.encode()).hexdigest()[:16],
    }
    labels.update({f"mugrpo/{k8s_name(k)}": k8s_label_value(v) for k, v in request.labels.items()})

    secret_keys = settings.s3_secret_keys if settings.s3_secret_name else ()
    plain = {"PYTHONUNBUFFERED": "1", "HF_HOME": settings.hf_cache_mount_path, **settings.env, **request.env}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items() if k not in secret_keys]
    env.extend(
        {"name": key, "valueFrom": {"secretKeyRef": {"name": settings.s3_secret_name, "key": key}}}
        for key in secret_keys
    )

    resources: dict[str, dict[str, Any]] = {
        section: dict(values) for section, values in settings.resources.get(kind, {}).items()
    }
    if gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = gpus

    mounts = [{"name": "hf-cache", "mountPath": settings.hf_cache_mount_path}]
    volumes: list[dict[str, Any]] = [
        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": settings.hf_cache_claim_name}}
        if settings.hf_cache_claim_name
        else {"name": "hf-cache", "emptyDir": {}}
    ]
    if gpus and settings.shm_size:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}})

    container: dict[str, Any] = {
        "name": "job",
        "image": settings.image_for(kind),
        "imagePullPolicy": settings.image_pull_policy,
        "command": request.command("python"),
        "env": env,
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
    }
    node_selector = {**settings.node_selector, **(settings.gpu_node_selector if gpus else {})}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = [*settings.tolerations, *(settings.gpu_tolerations if gpus else [])]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if settings.service_account_name:
        pod_spec["serviceAccountName"] = settings.service_account_name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(request.timeout_s)),
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


@register_launcher("kubernetes")
class KubernetesLauncher(Launcher):
    """Run the job as a Kubernetes Job (manifest from :func:`build_job_manifest`) with prefect-kubernetes' job
    helpers; pod log lines stream to ``on_line``. Needs the ``prefect-kubernetes`` package and in-cluster or
    kubeconfig credentials for the Kubernetes API (RBAC: infra/k8s/rbac.yaml).

    A Job outlives the flow pod that created it (an evicted flow pod cannot clean up). So before creating a Job,
    the launcher deletes the still-active Jobs of the same spec (label ``mugrpo/spec``, a hash of the spec URL):
    at most one job writes a stage's files at a time, as with the subprocess launcher.

    Args:
        settings: where and how pods run; None = :meth:`KubernetesJobSettings.from_env`.
        **overrides: fields of :class:`KubernetesJobSettings` replacing those of ``settings``.
    """

    def __init__(self, settings: KubernetesJobSettings | None = None, **overrides: Any):
        base = settings or KubernetesJobSettings.from_env()
        self.settings = KubernetesJobSettings.model_validate({**base.model_dump(), **overrides})

    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        try:
            from prefect_kubernetes.credentials import KubernetesCredentials
            from prefect_kubernetes.exceptions import KubernetesJobTimeoutError
            from prefect_kubernetes.jobs import KubernetesJob
        except ImportError as e:
            raise JobLaunchError(
                "the kubernetes launcher needs the prefect-kubernetes package (pip install prefect-kubernetes)",
                kind=request.kind,
            ) from e
        manifest = build_job_manifest(request, self.settings)
        job_name = manifest["metadata"]["name"]
        job_id = f"{self.settings.namespace}/{job_name}"
        credentials = KubernetesCredentials()  # in-cluster config, else the kubeconfig
        try:
            for stale in self._active_jobs(credentials, f"{SPEC_LABEL}={manifest['metadata']['labels'][SPEC_LABEL]}"):
                on_line(f"deleting the still-active Job {stale} of the same spec (an earlier attempt)")
                self._delete(credentials, stale)
            job_run = KubernetesJob(
                v1_job=manifest,
                namespace=self.settings.namespace,
                credentials=credentials,
                # The cluster enforces the deadline (activeDeadlineSeconds); this one bounds the watch loop.
                timeout_seconds=int(request.timeout_s) + 5 * self.settings.poll_interval_s,
                interval_seconds=self.settings.poll_interval_s,
                delete_after_completion=False,  # finished Jobs stay for `kubectl logs` until their TTL
            ).trigger()
        except Exception as e:  # the API refused the Job or is unreachable
            raise JobLaunchError(f"cannot create Kubernetes Job {job_id}: {e}", kind=request.kind) from e
        try:
            job_run.wait_for_completion(print_func=lambda line: on_line(clip_line(str(line))))
        except KubernetesJobTimeoutError:
            self._delete(credentials, job_name)
            return LaunchOutcome(exit_code=None, job_id=job_id, timed_out=True)
        except RuntimeError as e:  # the helper's message names the Job's failure reasons
            return LaunchOutcome(
                exit_code=self._exit_code(credentials, job_name),
                job_id=job_id,
                timed_out="DeadlineExceeded" in str(e),
                detail=str(e),
            )
        except BaseException:
            self._delete(credentials, job_name)
            raise
        return LaunchOutcome(exit_code=0, job_id=job_id)

    def _active_jobs(self, credentials: Any, label_selector: str) -> list[str]:
        """Names of the Jobs matching ``label_selector`` that still have running pods."""
        from prefect.utilities.asyncutils import run_coro_as_sync
        from prefect_kubernetes.jobs import list_namespaced_job

        jobs = run_coro_as_sync(
            list_namespaced_job.fn(
                kubernetes_credentials=credentials, namespace=self.settings.namespace, label_selector=label_selector
            )
        )
        return [j.metadata.name for j in jobs.items if j.status and j.status.active]

    def _delete(self, credentials: Any, job_name: str) -> None:
        """Delete a Job and its pods now (foreground propagation, no grace period); best effort."""
        from kubernetes_asyncio.client import V1DeleteOptions
        from prefect.utilities.asyncutils import run_coro_as_sync
        from prefect_kubernetes.jobs import delete_namespaced_job

        try:
            run_coro_as_sync(
                delete_namespaced_job.fn(
                    kubernetes_credentials=credentials,
                    job_name=job_name,
                    namespace=self.settings.namespace,
                    delete_options=V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=0),
                )
            )
        except Exception:  # noqa: BLE001  a finished Job is removed by its TTL anyway
            pass

    def _exit_code(self, credentials: Any, job_name: str) -> int | None:
        """Exit code of the Job's terminated container (None if unknown), so exit code 2 is not retried."""
        from prefect.utilities.asyncutils import run_coro_as_sync
        from prefect_kubernetes.pods import list_namespaced_pod

        try:
            pods = run_coro_as_sync(
                list_namespaced_pod.fn(
                    kubernetes_credentials=credentials,
                    namespace=self.settings.namespace,
                    label_selector=f"job-name={job_name}",
                )
            )
            for pod in pods.items:
                for status in (pod.status and pod.status.container_statuses) or []:
                    if status.state and status.state.terminated:
                        return status.state.terminated.exit_code
        except Exception:  # noqa: BLE001  the failure is reported either way
            pass
        return None
