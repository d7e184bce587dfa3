"""Launchers: start one job (a process with a CLI entry point), stream its output lines, wait for it, report.

A job is ``python -m mugrpo.jobs.{kind} SPEC_URL``: it imports no Prefect and talks only through files in object
storage (docs/design.md). A launcher decides *where* the process runs:

- ``subprocess``: a child process of the flow, in its own session (process group); on timeout, cancellation or
  death of the flow process the whole group is killed, so a resumed run never races a stale job
  (:mod:`tasks.launchers.subprocess_launcher`).
- ``kubernetes``: a Kubernetes Job in the job kind's image (GPU limits, node selector, tolerations, S3 credentials
  from a Secret, HF-cache volume), created or re-attached to and watched on the Kubernetes API
  (:mod:`tasks.kubernetes`); a Job outlives a dead flow and is re-attached on resume.

Launchers are looked up by name in :data:`~tasks.launchers.protocol.LAUNCHERS` (``@register_launcher("name")``).
:func:`~tasks.launchers.protocol.launch_job` is the one entry point: it runs a
:class:`~tasks.launchers.request.JobRequest` on a launcher and turns the outcome into a
:class:`~tasks.launchers.request.JobResult` or a :class:`~tasks.launchers.errors.JobError` carrying the job's last
output lines. Nothing here imports Prefect at module import.

The modules:

- :mod:`tasks.launchers.errors`: the errors of a job that did not complete.
- :mod:`tasks.launchers.request`: a job to run (:class:`~tasks.launchers.request.JobRequest`), what a launcher
  reports and what a completed job returns.
- :mod:`tasks.launchers.protocol`: the :class:`~tasks.launchers.protocol.Launcher` protocol, the registry of
  launchers and :func:`~tasks.launchers.protocol.launch_job`.
- :mod:`tasks.launchers.processes`: the process groups of running subprocess jobs and the threads reading their
  output.
- :mod:`tasks.launchers.prestart`: subprocess jobs started ahead and their priority while they wait.
- :mod:`tasks.launchers.subprocess_launcher`: the ``subprocess`` launcher.
"""
