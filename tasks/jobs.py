"""The Prefect task that launches one job, streams its output into the run's logs, and waits for it.

    from tasks.jobs import job_options, run_job

    result = run_job.with_options(**job_options(cfg.orchestration, tags=["run:r1", "stage:0"]))(
        "generate", spec_url, python=cfg.generation.python, env={}, timeout_s=cfg.orchestration.job_timeout_s,
        launcher=cfg.orchestration.launcher,
    )

Retries: a failed attempt is retried (task ``retries`` / ``retry_delay_seconds``) unless the failure cannot be
fixed by running the same job again (:func:`is_transient`): an exit code in
:data:`~tasks.launchers.errors.NON_RETRYABLE_EXIT_CODES` (a usage or spec error) or an error raised before any job
started. Retrying is cheap because every job resumes from what it committed to object storage.

No result is persisted and nothing is cached: object storage, not Prefect, decides what is done (docs/design.md).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.runtime import task_run as current_task_run

from tasks.launchers.errors import JobError
from tasks.launchers.protocol import LAUNCHERS, launch_job
from tasks.launchers.request import JobRequest, JobResult

if TYPE_CHECKING:  # mugrpo.config imports torch: keep this module light for flow processes and workers
    from mugrpo.config import OrchestrationSection

#: Prefix of the one-line JSON progress record a job prints (``mugrpo.jobs.segment`` after each committed stage);
#: :func:`run_job` turns these lines into a Prefect progress artifact. A test checks both sides agree.
PROGRESS_TAG = "mugrpo-segment-progress "

#: Task defaults when no config is at hand (the defaults of ``OrchestrationSection``; a test checks they agree);
#: flows set them from ``cfg.orchestration`` with :func:`job_options`.
DEFAULT_RETRIES = 1
DEFAULT_RETRY_DELAY_S = 5.0


def is_transient(exc: BaseException) -> bool:
    """Whether running the same job again may succeed: job failures and timeouts yes, except usage/spec errors
    (exit code 2); errors raised before a job ran (bad arguments, unknown launcher) no."""
    return isinstance(exc, JobError) and exc.transient


def _retry_condition(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only :func:`is_transient` failures."""
    try:
        state.result()
    except Exception as exc:  # the failure's exception is re-raised by result()
        return is_transient(exc)
    return False


@task(
    name="run-job",
    task_run_name="{kind}",
    retries=DEFAULT_RETRIES,
    retry_delay_seconds=DEFAULT_RETRY_DELAY_S,
    retry_condition_fn=_retry_condition,
    cache_policy=NO_CACHE,
    persist_result=False,
)
def run_job(
    kind: str,
    spec_url: str,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    launcher: str = "subprocess",
    launcher_options: Mapping[str, Any] | None = None,
    module: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> JobResult:
    """Run job ``kind`` on ``spec_url`` (``python -m mugrpo.jobs.{kind} SPEC_URL``) and wait for it.

    Each output line of the job (stdout and stderr, merged) is logged through the run logger as it arrives,
    prefixed with ``[kind]``.

    Args:
        kind: job kind: ``generate``, ``train``, ``eval``...
        spec_url: path or fsspec URL of the job's JSON spec.
        python: interpreter of the job (e.g. a vLLM virtualenv); None = this interpreter / the image's ``python``.
        env: extra environment of the job (strings). Credentials never go here: the job inherits them from the
            environment (subprocess) or a Secret (Kubernetes).
        timeout_s: wall-clock limit in seconds; the job (its whole process group / its Kubernetes Job) is killed
            past it and the attempt fails with :class:`~tasks.launchers.errors.JobTimeoutError`.
        launcher: name in :data:`tasks.launchers.protocol.LAUNCHERS` (``subprocess`` or ``kubernetes``).
        launcher_options: keyword arguments of the launcher (e.g. ``{"kill_grace_s": 5}``).
        module: module to run instead of ``mugrpo.jobs.{kind}`` (stand-in jobs in tests).
        labels: identifying key/values (run id, stage); labels of the Kubernetes Job.

    Returns:
        :class:`~tasks.launchers.request.JobResult`: exit code 0, wall seconds (launch to exit), last output lines.

    Raises:
        JobFailedError: non-zero exit; the message ends with the job's last 20 lines.
        JobTimeoutError: killed at ``timeout_s``.
        JobLaunchError: the launcher could not start or watch the job.
        ValueError: malformed arguments or unknown launcher (not retried).
    """
    logger = get_run_logger()
    request = job_request(
        kind, spec_url, python=python, env=env, timeout_s=timeout_s, module=module, labels=labels,
        attempt=max(1, int(current_task_run.run_count or 1)),
    )  # fmt: skip
    impl = LAUNCHERS[launcher](**dict(launcher_options or {}))
    progress = ProgressArtifact(kind, request.labels)
    logger.info(
        "launching %s job (attempt %d, %s launcher, timeout %g s): %s",
        kind,
        current_task_run.run_count,
        launcher,
        timeout_s,
        shlex.join(request.command(sys.executable)),
    )

    def on_line(line: str) -> None:
        logger.info("[%s] %s", kind, line)
        progress.feed(line)

    result = launch_job(request, impl, on_line=on_line)
    logger.info("%s job %s finished in %.1f s", kind, result.job_id, result.seconds)
    return result


def job_request(
    kind: str,
    spec_url: str,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    module: str | None = None,
    labels: Mapping[str, str] | None = None,
    attempt: int = 1,
) -> JobRequest:
    """The :class:`~tasks.launchers.request.JobRequest` :func:`run_job` launches (arguments as there): one builder,
    so a job pre-started by :func:`prestart_job` is the one its first attempt follows."""
    return JobRequest(
        kind=kind,
        spec_url=spec_url,
        timeout_s=timeout_s,
        python=python,
        env=dict(env or {}),
        module=module,
        labels=dict(labels or {}),
        attempt=attempt,
    )


def prestart_job(
    kind: str,
    spec_url: str,
    *,
    launcher: str = "subprocess",
    launcher_options: Mapping[str, Any] | None = None,
    **request: Any,
) -> bool:
    """Start job ``kind`` on ``spec_url`` ahead of the :func:`run_job` task run that will follow it (its first
    attempt, with the same arguments); ``request``: the keyword arguments of :func:`job_request`. Not a task run:
    the job's lines reach the run's logs once its task run follows it. Returns whether the launcher started it
    (see :meth:`tasks.launchers.protocol.Launcher.prestart`).

    Raises:
        JobLaunchError: the launcher could not start the job.
    """
    impl = LAUNCHERS[launcher](**dict(launcher_options or {}))
    started = impl.prestart(job_request(kind, spec_url, **request))
    if started:
        _logger().info("pre-started the %s job on %s (%s launcher): it waits for its inputs", kind, spec_url, launcher)
    return started


def discard_prestarted(
    labels: Mapping[str, str], *, launcher: str = "subprocess", launcher_options: Mapping[str, Any] | None = None
) -> int:
    """Stop the jobs pre-started on ``launcher`` whose labels include ``labels`` and that no task run followed."""
    return LAUNCHERS[launcher](**dict(launcher_options or {})).discard_prestarted(labels)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The run logger inside a flow or task run, else this module's logger."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


class ProgressArtifact:
    """A Prefect progress artifact fed by a job's :data:`PROGRESS_TAG` lines: percent of the job's stages
    committed, with the last stage's updates, reward and T_switch in its description. Never fails the job: a
    malformed line or an unreachable API is logged and ignored."""

    def __init__(
        self,
        kind: str,
        labels: Mapping[str, str],
        *,
        create: Any = create_progress_artifact,
        update: Any = update_progress_artifact,
    ) -> None:
        self.kind = kind
        self._create, self._update = create, update
        raw = f"{labels.get('run', 'run')}-{kind}-{labels.get('stage', '0')}".lower()
        self.key = re.sub(r"[^a-z0-9-]", "-", raw)
        self.artifact_id = None
        self.records: list[dict] = []

    def feed(self, line: str) -> dict | None:
        """Parse ``line`` when it is a progress record; create or update the artifact. Returns the record."""
        start = line.find(PROGRESS_TAG)
        if start < 0:
            return None
        try:
            record = json.loads(line[start + len(PROGRESS_TAG) :])
            percent = 100.0 * record["done"] / max(record["of"], 1)
            text = (
                f"{self.kind}: stage {record['stage']} committed ({record['done']} of {record['of']}), "
                f"policy version {record.get('policy_version')}, mean reward {record.get('mean_reward', 0.0):.3f}, "
                f"T_switch {record.get('t_switch', 0.0):.2f} s"
            )
        except (ValueError, KeyError, TypeError) as e:
            _logger().warning("malformed progress line %r: %s", line, e)
            return None
        self.records.append(record)
        try:
            if self.artifact_id is None:
                self.artifact_id = self._create(progress=percent, key=self.key, description=text)
            else:
                self._update(self.artifact_id, progress=percent, description=text)
        except Exception as e:  # the artifact is a view: never fail a job over it
            _logger().warning("progress artifact %s not updated: %s", self.key, e)
        return record


def job_options(orchestration: OrchestrationSection, *, tags: Iterable[str] = ()) -> dict[str, Any]:
    """Task options of :func:`run_job` from the config's orchestration section, for ``run_job.with_options``.

    Returns:
        ``{"retries": ..., "retry_delay_seconds": ..., "tags": {...}}``.
    """
    return {
        "retries": orchestration.retries,
        "retry_delay_seconds": orchestration.retry_delay_s,
        "tags": set(tags),
    }
