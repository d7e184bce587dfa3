"""The ``kubernetes`` launcher: each job runs as a Kubernetes Job in the image of its kind.

:func:`build_job_manifest` turns a :class:`~tasks.launchers.request.JobRequest` into a ``batch/v1`` Job (image, command,
GPU limits, node selector and tolerations, S3 credentials from a Secret through ``secretKeyRef``, an HF-cache
volume, tini as PID 1, Pod Security "restricted", requests = limits, multi-GPU launch); :class:`KubernetesLauncher`
creates it, or re-attaches to the Job a dead flow pod left running, and watches it (:mod:`tasks.k8s_watch`).
Where and how pods run comes from :class:`KubernetesJobSettings`, which the flow pod reads from its environment
(set by the work pool's base job template, infra/base-job-template.json).
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.k8s_watch import (
    CONTAINER,
    TEMPLATE_HASH_ANNOTATION,
    ApiRetry,
    JobWatch,
    WatchSettings,
    delete_job,
    ensure_job,
    ensure_service,
)
from tasks.launchers.errors import JobLaunchError
from tasks.launchers.protocol import Launcher, LineSink, register_launcher
from tasks.launchers.request import JobRequest, LaunchOutcome

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
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None,
        description="imagePullPolicy of job containers; None = IfNotPresent for images pinned by digest "
        "(@sha256:...), Always for tags (a tag may move: every pod then runs the tag's current image).",
    )
    gpus: dict[str, int] = Field(
        default_factory=lambda: {"generate": 1},
        description="nvidia.com/gpu limit per job kind (kinds not listed get no GPU).",
    )
    resources: dict[str, dict[str, dict[str, str]]] = Field(
        default_factory=dict,
        description="Container resources per job kind, replacing the defaults section by section, e.g. "
        "{train: {requests: {cpu: '8', memory: 64Gi}, limits: {cpu: '8', memory: 64Gi}}}.",
    )
    default_resources: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "2", "memory": "8Gi"},
        description="cpu/memory requests (= limits: Guaranteed QoS, never BestEffort) of CPU job pods.",
    )
    resources_per_gpu: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "6", "memory": "48Gi"},
        description="cpu/memory requests (= limits) of GPU job pods per GPU (8 GPUs: 48 cpu, 384Gi).",
    )
    multi_gpu_kinds: list[str] = Field(
        default_factory=lambda: ["train", "segment"],
        description="Job kinds run as one process per GPU (data parallel) when given more than one GPU; other "
        "kinds (generate: vLLM shards over its GPUs itself) stay one process.",
    )
    multi_gpu_launcher: Literal["accelerate", "torchrun"] = Field(
        "accelerate",
        description="Process launcher of multi-GPU jobs in one pod: `accelerate launch --multi_gpu --num_processes N` "
        "or `torchrun --standalone --nproc_per_node N` (several pods: `nodes`).",
    )
    launcher_args: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Extra arguments of the multi-GPU process launcher per job kind, before `-m MODULE`, e.g. FSDP "
        "on one pod with accelerate: {train: [--use_fsdp, --fsdp_version, '2', --fsdp_auto_wrap_policy, "
        "TRANSFORMER_BASED_WRAP, --fsdp_transformer_layer_cls_to_wrap, LlamaDecoderLayer, --fsdp_state_dict_type, "
        "FULL_STATE_DICT]} (mugrpo.jobs.train). FSDP has not run on a GPU in this project yet.",
    )
    nodes: dict[str, int] = Field(
        default_factory=dict,
        description="Pods per job kind (kinds not listed: 1). N > 1 runs a kind of `multi_gpu_kinds` multi-node: an "
        "Indexed Job of N pods (completionMode Indexed, completions = parallelism = N), each `torchrun --nnodes N "
        "--node_rank INDEX --nproc_per_node GPUS` with a static rendezvous on pod 0, reached through a headless "
        "Service named after the Job (infra/README.md: why not the Training Operator's PyTorchJob).",
    )
    rendezvous_port: int = Field(29500, ge=1, le=65535, description="TCP port of the multi-node rendezvous on pod 0.")
    init_command: list[str] = Field(
        default_factory=lambda: ["tini", "-g", "--"],
        description="Command prefix of job containers: an init as PID 1 that forwards SIGTERM to the job's "
        "process group and reaps orphans (the image's tini); [] = run the job as PID 1.",
    )
    run_as_user: int = Field(10001, ge=1, description="UID (and GID, fsGroup) of job pods: the image's user.")
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
    poll_interval_s: float = Field(
        10.0, gt=0, description="Seconds between two reads of the Job and its pods (the API load of one job)."
    )
    pending_timeout_s: float = Field(
        1200.0,
        gt=0,
        description="A Job whose container has not started after this many seconds (unschedulable, "
        "ImagePullBackOff, missing Secret/PVC, pods refused by quota or admission) is deleted and the attempt "
        "fails with the pod's reason; leaves time for a cluster autoscaler to add a GPU node.",
    )
    api_retry_window_s: float = Field(
        300.0,
        gt=0,
        description="Transient Kubernetes API errors (429, 5xx, connection) are retried with backoff this long "
        "before the attempt gives up (leaving the Job running for the next attempt to re-attach).",
    )
    api_backoff_max_s: float = Field(30.0, gt=0, description="Longest wait between two retries of an API call.")
    delete_wait_s: float = Field(
        600.0, gt=0, description="How long to wait for a replaced Job and its pods to be gone before failing."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra plain env of every job pod (e.g. AWS_DEFAULT_REGION); no secrets."
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KubernetesJobSettings:
        """Settings from ``MUGRPO_K8S_JOB_SETTINGS`` (a JSON object, or the Python repr of a dict as the work pool
        template writes its ``job_settings`` variable) and the single-field variables of :data:`K8S_FIELD_ENV`.

        A field set in the JSON wins over its single-field variable, so ``{"s3_secret_name": null}`` means "no
        Secret: the pod's service account has the storage access (workload identity)" although the work pool's
        ``s3_secret_name`` variable still holds its default. Empty single-field values are ignored.

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
            if environ.get(var) and name not in data:
                data[name] = environ[var]
        return cls.model_validate(data)

    def gpus_for(self, kind: str) -> int:
        """GPUs of a job of kind ``kind``: ``gpus[kind]``; the eval job, which samples with the generation engine,
        gets the generate job's unless ``gpus['eval']`` is set; else 0."""
        if kind == "eval" and "eval" not in self.gpus:
            return self.gpus.get("generate", 0)
        return self.gpus.get(kind, 0)

    def image_for(self, kind: str) -> str:
        """The image of job kind ``kind``. The eval job samples with the generation engine, so without
        ``images['eval']`` it runs in the generation image (e.g. the vLLM image), as ``eval.python`` follows
        ``generation.python``.

        Raises:
            ValueError: neither ``images[kind]`` nor ``image`` is set.
        """
        image = self.images.get(kind) or (self.images.get("generate") if kind == "eval" else None) or self.image
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


_QUANTITY = re.compile(r"(\d+)([A-Za-z]*)")


def scale_quantity(quantity: str, factor: int) -> str:
    """``quantity`` (an integer with an optional unit suffix: ``6``, ``500m``, ``48Gi``) times ``factor``.

    Raises:
        ValueError: not an integer quantity.
    """
    match = _QUANTITY.fullmatch(str(quantity))
    if not match:
        raise ValueError(f"resources_per_gpu: {quantity!r} is not an integer Kubernetes quantity such as '48Gi'")
    return f"{int(match.group(1)) * factor}{match.group(2)}"


def job_name(request: JobRequest) -> str:
    """Deterministic Job name from (run, stage, kind, attempt, spec): ``mugrpo-{run}-s{stage}-{kind}-a{n}-{hash}``.

    The same attempt of the same job always gets the same name, so a resumed flow finds the Job of its
    predecessor (409 on create) instead of racing it; the 8-hex spec hash keeps names unique when the run id is
    cut to fit the 63 characters of a label value (the Job controller labels pods ``job-name=NAME``).
    """
    spec = hashlib.sha256(request.spec_url.encode()).hexdigest()[:8]
    suffix = k8s_name(request.kind, f"a{request.attempt}", spec)
    run, stage = request.labels.get("run", ""), request.labels.get("stage", "")
    prefix = k8s_name("mugrpo", run, f"s{stage}" if stage else "", max_len=62 - len(suffix))
    return f"{prefix}-{suffix}".replace("--", "-")


#: Env var of a multi-node pod holding its node rank (its Indexed Job completion index, through the downward API).
NODE_RANK_ENV = "MUGRPO_NODE_RANK"
#: Pod annotation the Job controller sets to the completion index of an Indexed Job's pod.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def job_nodes(kind: str, settings: KubernetesJobSettings) -> int:
    """Pods of a job kind: ``settings.nodes[kind]`` for a kind of ``multi_gpu_kinds``, else 1.

    Raises:
        ValueError: more than one node asked for a kind that is not data parallel.
    """
    nodes = settings.nodes.get(kind, 1)
    if nodes > 1 and kind not in settings.multi_gpu_kinds:
        raise ValueError(
            f"nodes[{kind!r}] = {nodes}: only the data-parallel kinds {settings.multi_gpu_kinds} run over several "
            "pods (generation scales out with generation.workers instead)"
        )
    return max(nodes, 1)


def multinode_command(
    python: str,
    module: str,
    spec_url: str,
    *,
    nodes: int,
    procs_per_node: int,
    node_rank: str,
    master_addr: str,
    master_port: int,
    extra: list[str] = (),
) -> list[str]:
    """``torchrun`` of one node of a multi-node job with a static rendezvous (no etcd, no elastic restarts:
    every node must be present, a lost node fails the attempt and Prefect retries it; the job resumes from its
    checkpoint): ``python -m torch.distributed.run --nnodes N --nproc_per_node P --node_rank R --rdzv_backend
    static --master_addr A --master_port PORT -m MODULE SPEC``. Node 0 hosts the rendezvous store at A:PORT.

    The Kubernetes launcher renders it with ``node_rank = $(MUGRPO_NODE_RANK)`` (expanded by the kubelet from the
    pod's completion index) and ``master_addr = {job}-0.{job}`` (pod 0's DNS name under the headless Service);
    the multi-node test runs it on 127.0.0.1 with two "nodes" of one CPU process each.
    """
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(procs_per_node),
        "--node_rank",
        node_rank,
        "--rdzv_backend",
        "static",
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        *extra,
        "-m",
        module,
        spec_url,
    ]


def job_command(request: JobRequest, settings: KubernetesJobSettings, name: str | None = None) -> list[str]:
    """The job container's command: the init (tini), then ``python -m MODULE SPEC``, or, for a kind in
    ``settings.multi_gpu_kinds`` given N > 1 GPUs, one process per GPU through ``accelerate launch`` (``python -m
    accelerate.commands.launch --multi_gpu --num_processes N --num_machines 1 -m MODULE SPEC``) or ``torchrun``
    (``python -m torch.distributed.run --standalone --nproc_per_node N -m MODULE SPEC``). The interpreter is the
    job's own (``request.python``), so the launcher runs from the same environment as the job. A kind run on
    N > 1 pods (``settings.nodes``) runs :func:`multinode_command` (one torchrun per pod, GPUS processes each) with
    pod 0 of Job ``name`` as the rendezvous."""
    python, gpus = request.python or "python", settings.gpus_for(request.kind)
    extra = list(settings.launcher_args.get(request.kind, []))
    nodes = job_nodes(request.kind, settings)
    if nodes > 1:
        name = name or job_name(request)
        run = multinode_command(
            python,
            request.module_name,
            request.spec_url,
            nodes=nodes,
            procs_per_node=max(gpus, 1),
            node_rank=f"$({NODE_RANK_ENV})",
            master_addr=f"{name}-0.{name}",
            master_port=settings.rendezvous_port,
            extra=extra,
        )
    elif gpus > 1 and request.kind in settings.multi_gpu_kinds:
        if settings.multi_gpu_launcher == "accelerate":
            launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(gpus)]
            launch += ["--num_machines", "1"]
        else:
            launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
        run = [python, *launch, *extra, "-m", request.module_name, request.spec_url]
    else:
        run = request.command(python)
    return [*settings.init_command, *run]


def job_resources(kind: str, settings: KubernetesJobSettings) -> dict[str, dict[str, Any]]:
    """requests and limits of the job container: ``default_resources`` (CPU jobs) or ``resources_per_gpu`` times
    the GPU count, requests = limits (Guaranteed QoS), then ``settings.resources[kind]`` section by section."""
    gpus = settings.gpus_for(kind)
    base = (
        {k: scale_quantity(v, gpus) for k, v in settings.resources_per_gpu.items()}
        if gpus
        else dict(settings.default_resources)
    )
    resources: dict[str, dict[str, Any]] = {"requests": dict(base), "limits": dict(base)}
    for section, values in settings.resources.get(kind, {}).items():
        resources[section] = dict(values)
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = gpus
    return resources


def pull_policy(image: str, settings: KubernetesJobSettings) -> str:
    """``settings.image_pull_policy``, else IfNotPresent for digest-pinned images and Always for tags."""
    return settings.image_pull_policy or ("IfNotPresent" if "@sha256:" in image else "Always")


def build_job_manifest(request: JobRequest, settings: KubernetesJobSettings, name: str | None = None) -> dict:
    """The ``batch/v1`` Job manifest (a plain dict) that runs ``request`` in its image.

    One container runs :func:`job_command` under tini; ``activeDeadlineSeconds`` enforces the timeout inside the
    cluster; ``backoffLimit: 0`` leaves retries to Prefect (task retries) so every attempt is visible there, except
    that a pod lost to node disruption (preemption, drain: condition ``DisruptionTarget``) is replaced by the Job
    controller (``podFailurePolicy``), only once it is gone (``podReplacementPolicy: Failed``). Pods run as the
    image's non-root user under Pod Security "restricted"; the cache volume is group-writable through ``fsGroup``.
    S3 credentials come from ``settings.s3_secret_name`` through ``secretKeyRef`` (never from flow parameters or
    the image), or from the pod's service account when it is None; the HF cache is a volume at
    ``settings.hf_cache_mount_path`` (``HF_HOME``). The annotation ``mugrpo/template-hash`` identifies the pod
    template, so a resumed launcher re-attaches only to a Job running the same thing.

    Args:
        name: Job name; default :func:`job_name`.

    Raises:
        ValueError: no image for the job kind, or a malformed resource quantity.
    """
    kind = request.kind
    name = name or job_name(request)
    gpus = settings.gpus_for(kind)
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

    mounts = [{"name": "hf-cache", "mountPath": settings.hf_cache_mount_path}]
    volumes: list[dict[str, Any]] = [
        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": settings.hf_cache_claim_name}}
        if settings.hf_cache_claim_name
        else {"name": "hf-cache", "emptyDir": {}}
    ]
    if gpus and settings.shm_size:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}})

    nodes = job_nodes(kind, settings)
    if nodes > 1:  # defined before the command that references it as $(MUGRPO_NODE_RANK)
        annotation = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
        env.append({"name": NODE_RANK_ENV, "valueFrom": {"fieldRef": {"fieldPath": annotation}}})
    image = settings.image_for(kind)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy(image, settings),
        "command": job_command(request, settings, name),
        "env": env,
        "resources": job_resources(kind, settings),
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    uid = settings.run_as_user
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    node_selector = {**settings.node_selector, **(settings.gpu_node_selector if gpus else {})}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = [*settings.tolerations, *(settings.gpu_tolerations if gpus else [])]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if settings.service_account_name:
        pod_spec["serviceAccountName"] = settings.service_account_name
    if nodes > 1:
        pod_spec["subdomain"] = name  # pod i is {name}-i.{name}: DNS through the headless Service of that name
        container["ports"] = [{"name": "rendezvous", "containerPort": settings.rendezvous_port}]
    template = {"metadata": {"labels": dict(labels)}, "spec": pod_spec}
    # The Job's own name (in a multi-node pod's subdomain and rendezvous address) is left out of the hash: a
    # later attempt (another name) still re-attaches to a running Job of the same spec and pod template.
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).replace(name, "{job}").encode()).hexdigest()[:16]
    indexed = {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes} if nodes > 1 else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {TEMPLATE_HASH_ANNOTATION: digest},
        },
        "spec": {
            **indexed,
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(request.timeout_s)),
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
            },
            "template": template,
        },
    }


def build_rendezvous_service(job: dict, owner_uid: str | None = None) -> dict | None:
    """The headless Service (``clusterIP: None``) that gives the pods of a multi-node Job stable DNS names
    (``{job}-{index}.{job}``), so every node reaches the rendezvous on pod 0; None for a one-pod Job. Named
    after the Job, selecting its pods (``batch.kubernetes.io/job-name``); ``publishNotReadyAddresses`` so the
    names resolve as soon as the pods have IPs. With ``owner_uid`` it is owned by the Job, and deleted with it.
    """
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        return None
    meta = job["metadata"]
    name = meta["name"]
    port = spec["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": meta["namespace"], "labels": dict(meta["labels"])},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": name},
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
    if owner_uid:
        service["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": owner_uid, "blockOwnerDeletion": False}
        ]
    return service


#: Jobs created ahead by :meth:`KubernetesLauncher.prestart` that no run re-attached to yet: request identity ->
#: (namespace, Job name, labels).
_PRESTARTED: dict[tuple, tuple[str, str, dict[str, str]]] = {}
_PRESTART_LOCK = threading.Lock()


@register_launcher("kubernetes")
class KubernetesLauncher(Launcher):
    """Run the job as a Kubernetes Job (manifest from :func:`build_job_manifest`), watched by
    :mod:`tasks.k8s_watch` on the ``kubernetes_asyncio`` client; pod log lines stream to ``on_line``. Credentials
    for the Kubernetes API: in-cluster (the flow pod's service account, RBAC in infra/k8s/rbac.yaml) when
    ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig (``KUBECONFIG``).

    A Job outlives the flow pod that created it (a hard-killed flow pod cannot clean up), and its name is
    deterministic (:func:`job_name`): a resumed attempt re-attaches to a still-running Job of the same spec and
    pod template and follows its logs instead of relaunching; a Job it has to replace is deleted first and the new
    one created only once the old one and its pods are gone. The launcher deletes a Job only when it decided to
    stop it: timeout, pending timeout, cancellation of the task, or replacement. API errors never do.

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
        (:func:`tasks.k8s_watch.ensure_job`: same spec, same pod template). Not for a multi-node job, whose
        rendezvous Service is created with it at :meth:`run`. The Job's ``activeDeadlineSeconds`` counts from
        its creation, so its wait is part of ``timeout_s``.

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


def _run_coro(coro: Any) -> Any:
    """Run ``coro`` to its end from sync code: on this thread (no event loop runs here), else on a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
