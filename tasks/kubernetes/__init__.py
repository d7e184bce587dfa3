"""The ``kubernetes`` launcher: each job runs as a Kubernetes Job in the image of its kind.

:func:`~tasks.kubernetes.manifests.build_job_manifest` turns a :class:`~tasks.launchers.request.JobRequest` into a
``batch/v1`` Job (image, command, GPU limits, node selector and tolerations, S3 credentials from a Secret through
``secretKeyRef``, an HF-cache volume, tini as PID 1, Pod Security "restricted", requests = limits, multi-GPU
launch); :class:`~tasks.kubernetes.launcher.KubernetesLauncher` creates it, or re-attaches to the Job a dead flow pod
left running, and watches it (:mod:`tasks.kubernetes.watch`). Where and how pods run comes from
:class:`~tasks.kubernetes.settings.KubernetesJobSettings`, which the flow pod reads from its environment (set by the
work pool's base job template, infra/base-job-template.json).

The Kubernetes side runs on the ``kubernetes_asyncio`` client (the one prefect-kubernetes uses) and follows rules,
each one a failure seen on real clusters, stated in the module that keeps it: API errors are not job failures
(:mod:`~tasks.kubernetes.api`); a bounded poll rate, and pods that cannot start fail fast, with the reason
(:mod:`~tasks.kubernetes.watch`); re-attach, never relaunch (:mod:`~tasks.kubernetes.objects`); logs survive dropped
streams (:mod:`~tasks.kubernetes.logs`).

The modules:

- :mod:`tasks.kubernetes.settings`: where and how job pods run, read from the flow pod's environment.
- :mod:`tasks.kubernetes.names`: a job's Kubernetes names and label values.
- :mod:`tasks.kubernetes.commands`: the job container's command (one process, one per GPU, or one node of a
  multi-node job).
- :mod:`tasks.kubernetes.manifests`: the Job manifest and the headless Service of a multi-node Job.
- :mod:`tasks.kubernetes.api`: calls to the Kubernetes API: the client, their retries, their bodies, the timing.
- :mod:`tasks.kubernetes.state`: what a Job and its pods say about the job (finished, started, exit code, why
  pending).
- :mod:`tasks.kubernetes.objects`: create, re-attach to and delete a job's Job (and a multi-node Job's Service).
- :mod:`tasks.kubernetes.logs`: where a pod's log was left, so a dropped stream resumes there.
- :mod:`tasks.kubernetes.watch`: the watch of one Job to its end, following its pods' logs.
- :mod:`tasks.kubernetes.launcher`: the ``kubernetes`` launcher.
"""
