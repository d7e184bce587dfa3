"""Launchers: start one job (a process with a CLI entry point), stream its output lines, wait for it, report.

A job is ``python -m mugrpo.jobs.{kind} SPEC_URL``: it imports no Prefect and talks only through files in object
storage (design.md). A launcher decides *where* the process runs:

- ``subprocess``: a child process of the flow, in its own session (process group); on timeout, cancellation or
  death of the flow process the whole group is killed, so a resumed run never races a stale job.
- ``kubernetes``: a Kubernetes Job in the job kind's image (GPU limits, node selector, tolerations, S3 credentials
  from a Secret, HF-cache volume), created and watched with prefect-kubernetes' job helpers.

Launchers are looked up by name in :data:`LAUNCHERS` (``@register_launcher("name")``). :func:`launch_job` is the
one entry point: it runs a :class:`JobRequest` on a launcher and turns the outcome into a :class:`JobResult` or a
:class:`JobError` carrying the job's last output lines. Nothing here imports Prefect at module import.
"""

from __future__ import annotations

import ast
import atexit
import ctypes
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

#: Output lines of a job kept for results and error messages.
TAIL_LINES = 20
#: Characters kept of one output line (a progress bar without newlines must not flood the logs).
MAX_LINE_CHARS = 4000
#: Exit codes that mean "the command line or the spec is wrong": a retry cannot help (argparse/typer usage errors and
#: ``mugrpo.jobs.common.load_spec`` exit with 2).
NON_RETRYABLE_EXIT_CODES = frozenset({2})

_KIND_RE = re.compile(r"[a-z][a-z0-9_]*")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

LineSink = Callable[[str], None]


# ----------------------------------------------------------------------------------------------------------- errors
class JobError(RuntimeError):
    """A job did not complete. ``last_lines`` holds its last output lines (oldest first)."""

    #: Whether a retry of the same job can succeed (Prefect's retry condition reads it).
    transient = True

    def __init__(self, message: str, *, kind: str, last_lines: tuple[str, ...] = ()):
        self.kind = kind
        self.last_lines = tuple(last_lines)
        if self.last_lines:
            message += f"\n--- last {len(self.last_lines)} lines of the {kind} job ---\n" + "\n".join(self.last_lines)
        super().__init__(message)


class JobFailedError(JobError):
    """The job exited with a non-zero code (``exit_code``; negative = killed by that signal, None = unknown)."""

    def __init__(self, message: str, *, kind: str, exit_code: int | None, last_lines: tuple[str, ...] = ()):
        self.exit_code = exit_code
        self.transient = exit_code not in NON_RETRYABLE_EXIT_CODES
        super().__init__(message, kind=kind, last_lines=last_lines)


class JobTimeoutError(JobError):
    """The job ran longer than its timeout and was killed (its whole process group, or its Kubernetes Job)."""

    def __init__(self, message: str, *, kind: str, timeout_s: float, last_lines: tuple[str, ...] = ()):
        self.timeout_s = timeout_s
        super().__init__(message, kind=kind, last_lines=last_lines)


class JobLaunchError(JobError):
    """The launcher could not start or watch the job (e.g. the Kubernetes API failed); usually transient."""


# ------------------------------------------------------------------------------------------------ request / result
@dataclass(frozen=True)
class JobRequest:
    """One job to run.

    Attributes:
        kind: job kind (``generate``, ``train``, ``eval``...): the module ``mugrpo.jobs.{kind}`` runs.
        spec_url: path or fsspec URL of the job's JSON spec, passed as the only argument.
        timeout_s: wall-clock limit in seconds; past it the job is killed and :class:`JobTimeoutError` raised.
        python: interpreter of the job in its environment (e.g. a vLLM virtualenv); None = this interpreter
            (subprocess) or the image's ``python`` (Kubernetes).
        env: extra environment variables (strings), on top of what the launcher passes. Never put credentials here:
            they come from the environment (subprocess) or a Secret (Kubernetes).
        module: module to run instead of ``mugrpo.jobs.{kind}`` (stand-in jobs in tests, custom jobs).
        labels: small key/values identifying the job (run id, stage); Kubernetes labels on the Job.

    Raises:
        ValueError: a malformed kind, module, timeout or environment entry (the message names it).
    """

    kind: str
    spec_url: str
    timeout_s: float
    python: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    module: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _KIND_RE.fullmatch(self.kind):
            raise ValueError(f"job kind {self.kind!r} must be a lowercase identifier such as 'generate'")
        if self.module is not None and not _MODULE_RE.fullmatch(self.module):
            raise ValueError(f"job module {self.module!r} is not a dotted Python module name")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        for key, value in self.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"env entry {key!r}={value!r} of the {self.kind} job: keys and values must be str")

    @property
    def module_name(self) -> str:
        """The module run with ``python -m``."""
        return self.module or f"mugrpo.jobs.{self.kind}"

    def command(self, default_python: str) -> list[str]:
        """``[python, "-m", module, spec_url]`` with ``python`` falling back to ``default_python``."""
        return [self.python or default_python, "-m", self.module_name, self.spec_url]


@dataclass(frozen=True)
class LaunchOutcome:
    """What a launcher reports: how the job ended. Job failures are outcomes, not exceptions."""

    exit_code: int | None
    job_id: str
    timed_out: bool = False
    detail: str = ""


@dataclass(frozen=True)
class JobResult:
    """A completed job: exit code (0), wall seconds from launch to exit, last output lines, where it ran."""

    kind: str
    exit_code: int
    seconds: float
    last_lines: tuple[str, ...]
    launcher: str
    job_id: str


# ----------------------------------------------------------------------------------------------------- registry
class Launcher(ABC):
    """Runs a :class:`JobRequest` to its end. Subclasses register with ``@register_launcher(name)``."""

    name: ClassVar[str] = ""

    @abstractmethod
    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        """Start the job, call ``on_line`` (from the calling thread) with each output line as it arrives, wait.

        Must enforce ``request.timeout_s`` (returning ``timed_out=True`` after killing the job) and must kill the
        job before re-raising if the wait is interrupted (task cancellation, KeyboardInterrupt).

        Raises:
            JobLaunchError: the job could not be started or watched.
        """


LAUNCHERS: dict[str, type[Launcher]] = {}


def register_launcher(name: str) -> Callable[[type[Launcher]], type[Launcher]]:
    """Class decorator: register a :class:`Launcher` subclass under ``name``.

    Raises:
        ValueError: ``name`` is already registered.
    """

    def deco(cls: type[Launcher]) -> type[Launcher]:
        if name in LAUNCHERS:
            raise ValueError(f"launcher {name!r} is already registered ({LAUNCHERS[name].__qualname__})")
        cls.name = name
        LAUNCHERS[name] = cls
        return cls

    return deco


def get_launcher(name: str, **options: Any) -> Launcher:
    """Instantiate the launcher registered as ``name`` with ``options``.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    try:
        cls = LAUNCHERS[name]
    except KeyError:
        raise ValueError(f"unknown launcher {name!r}; registered: {sorted(LAUNCHERS)}") from None
    return cls(**options)


def launch_job(request: JobRequest, launcher: Launcher, on_line: LineSink | None = None) -> JobResult:
    """Run ``request`` on ``launcher``; stream lines to ``on_line``; return a :class:`JobResult` on exit code 0.

    Raises:
        JobTimeoutError: the job ran past ``request.timeout_s`` and was killed.
        JobFailedError: the job exited non-zero (or its Kubernetes Job failed).
        JobLaunchError: the launcher could not start or watch the job.
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def sink(line: str) -> None:
        tail.append(line)
        if on_line is not None:
            on_line(line)

    t0 = time.monotonic()
    outcome = launcher.run(request, sink)
    seconds = time.monotonic() - t0
    last = tuple(tail)
    where = f"{request.kind} job {outcome.job_id} ({launcher.name}, spec {request.spec_url})"
    if outcome.timed_out:
        raise JobTimeoutError(
            f"{where} exceeded its timeout of {request.timeout_s:g} s and was killed after {seconds:.1f} s"
            + (f"; {outcome.detail}" if outcome.detail else ""),
            kind=request.kind, timeout_s=request.timeout_s, last_lines=last,
        )
    if outcome.exit_code != 0:
        raise JobFailedError(
            f"{where} failed after {seconds:.1f} s: {describe_exit(outcome.exit_code)}"
            + (f"; {outcome.detail}" if outcome.detail else ""),
            kind=request.kind, exit_code=outcome.exit_code, last_lines=last,
        )
    return JobResult(request.kind, 0, seconds, last, launcher.name, outcome.job_id)


def describe_exit(exit_code: int | None) -> str:
    """Human text for a process exit code: ``exit code 3``, ``killed by SIGKILL``, ``exit code unknown``."""
    if exit_code is None:
        return "exit code unknown"
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def _clip(line: str) -> str:
    line = line.rstrip("\r\n")
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [...]"


# --------------------------------------------------------------------------------------------------- subprocess
_EOF = object()
#: Process groups of running subprocess jobs; killed at interpreter exit so a dying flow leaves no job behind.
_LIVE_GROUPS: set[int] = set()
_LIVE_LOCK = threading.Lock()


def _kill_live_groups() -> None:
    with _LIVE_LOCK:
        groups = list(_LIVE_GROUPS)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


atexit.register(_kill_live_groups)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _pump(stream: IO[str], lines: queue.Queue) -> None:
    """Reader thread: move output lines of the job to ``lines`` until EOF (every writer of the pipe is gone)."""
    try:
        for line in stream:
            lines.put(_clip(line))
    except (OSError, ValueError):  # the pipe was closed under us after a kill
        pass
    finally:
        lines.put(_EOF)


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the job when the thread that started it ends (Linux
    ``prctl(PR_SET_PDEATHSIG)``). The launcher waits for the job in that thread, so this fires when the flow
    process dies, even by SIGKILL: a dead flow cannot leave a job running. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent: the child only makes one foreign call
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(137)

    return preexec


@register_launcher("subprocess")
class SubprocessLauncher(Launcher):
    """Run the job as a child process in its own session; stdout and stderr are merged, line by line.

    The child's environment is this process's environment, then ``PYTHONUNBUFFERED=1`` (lines arrive as they are
    printed, not when a buffer fills), then ``request.env``.

    Args:
        kill_grace_s: seconds between SIGTERM and SIGKILL to the job's process group on timeout or cancellation.
        kill_with_parent: Linux only: the kernel SIGKILLs the job's leader process if this process dies (even by
            SIGKILL); its own children are then killed by the group kill of the next attempt or by the job itself.
    """

    def __init__(self, kill_grace_s: float = 10.0, kill_with_parent: bool = True):
        if kill_grace_s < 0:
            raise ValueError(f"kill_grace_s must be >= 0, got {kill_grace_s}")
        self.kill_grace_s = kill_grace_s
        self.kill_with_parent = kill_with_parent

    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **request.env}
        try:
            proc = subprocess.Popen(
                request.command(sys.executable),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,  # own session and process group: pgid == pid
                preexec_fn=_parent_death_signal() if self.kill_with_parent else None,
            )
        except OSError as e:
            raise JobLaunchError(
                f"cannot start the {request.kind} job {request.command(sys.executable)}: {e}", kind=request.kind
            ) from e
        pgid = proc.pid
        with _LIVE_LOCK:
            _LIVE_GROUPS.add(pgid)
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), name=f"job-{pgid}-output", daemon=True)
        reader.start()
        deadline = time.monotonic() + request.timeout_s
        timed_out, eof, detail = False, False, ""
        try:
            while proc.poll() is None:
                if time.monotonic() >= deadline:
                    timed_out = True
                    self._terminate(proc, lines, on_line)
                    break
                eof = self._drain(lines, on_line, wait_s=min(0.2, max(deadline - time.monotonic(), 0.0))) or eof
        except BaseException:
            # Cancellation or interrupt while waiting: the job must not outlive the task that launched it.
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            # Stragglers: processes the job left behind in its group hold the pipe open and may write files.
            if _signal_group(pgid, signal.SIGKILL) and not timed_out:
                detail = "processes left behind in the job's process group were killed"
            with _LIVE_LOCK:
                _LIVE_GROUPS.discard(pgid)
        end = time.monotonic() + 5.0
        while not eof and time.monotonic() < end:
            eof = self._drain(lines, on_line, wait_s=0.2)
        reader.join(timeout=1.0)
        if proc.stdout is not None and not reader.is_alive():
            # (A reader still blocked on the pipe means a process outside the group holds it open; closing the
            # stream would block on the reader's lock, so the daemon thread keeps it until that process exits.)
            proc.stdout.close()
        return LaunchOutcome(exit_code=proc.wait(), job_id=f"pid {pgid}", timed_out=timed_out, detail=detail)

    @staticmethod
    def _drain(lines: queue.Queue, on_line: LineSink, wait_s: float) -> bool:
        """Pass queued lines to ``on_line`` (waiting up to ``wait_s`` for the first); True once EOF was seen."""
        try:
            item = lines.get(timeout=wait_s) if wait_s > 0 else lines.get_nowait()
        except queue.Empty:
            return False
        while True:
            if item is _EOF:
                return True
            on_line(item)
            try:
                item = lines.get_nowait()
            except queue.Empty:
                return False

    def _terminate(self, proc: subprocess.Popen, lines: queue.Queue, on_line: LineSink) -> None:
        """SIGTERM the job's group, keep streaming its last words for ``kill_grace_s``, then SIGKILL the group."""
        _signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + self.kill_grace_s
        while proc.poll() is None and time.monotonic() < end:
            self._drain(lines, on_line, wait_s=0.1)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


# --------------------------------------------------------------------------------------------------- kubernetes
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
        default_factory=dict, description="Extra nodeSelector of GPU job pods, e.g. {cloud.google.com/gke-accelerator: "
        "nvidia-h100-80gb}."
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
            job_run.wait_for_completion(print_func=lambda line: on_line(_clip(str(line))))
        except KubernetesJobTimeoutError:
            self._delete(credentials, job_name)
            return LaunchOutcome(exit_code=None, job_id=job_id, timed_out=True)
        except RuntimeError as e:  # the helper's message names the Job's failure reasons
            return LaunchOutcome(
                exit_code=self._exit_code(credentials, job_name), job_id=job_id,
                timed_out="DeadlineExceeded" in str(e), detail=str(e),
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
                    kubernetes_credentials=credentials, job_name=job_name, namespace=self.settings.namespace,
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
                    kubernetes_credentials=credentials, namespace=self.settings.namespace,
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
