"""Where and how job pods run on Kubernetes (:class:`KubernetesJobSettings`), read by the flow pod from its
environment: a JSON object of fields and single-field variables, set by the work pool's base job template
(infra/base-job-template.json)."""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
