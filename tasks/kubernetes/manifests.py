"""The manifests the kubernetes launcher submits: a job's ``batch/v1`` Job (:func:`build_job_manifest`: image,
command, resources, security context, volumes, node selection) and the headless Service of a multi-node Job
(:func:`build_rendezvous_service`)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from mugrpo.common.preemption import GRACE_ENV, grace_from_env, termination_grace_period_s
from tasks.kubernetes.commands import COMPLETION_INDEX_ANNOTATION, NODE_RANK_ENV, job_command, job_nodes
from tasks.kubernetes.names import SPEC_LABEL, job_name, k8s_label_value, k8s_name
from tasks.kubernetes.objects import TEMPLATE_HASH_ANNOTATION
from tasks.kubernetes.settings import KubernetesJobSettings
from tasks.kubernetes.state import CONTAINER
from tasks.launchers.request import JobRequest

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
    template, so a resumed launcher re-attaches only to a Job running the same thing. A job's grace
    (:data:`~mugrpo.common.preemption.GRACE_ENV` in its environment: seconds from its SIGTERM to its SIGKILL) sets
    the pod's ``terminationGracePeriodSeconds`` (:func:`~mugrpo.common.preemption.termination_grace_period_s`), so an
    eviction or a node drain gives the job the time to save the update in flight that a stop does.

    Args:
        name: Job name; default :func:`job_name`.

    Raises:
        ValueError: no image for the job kind, a malformed resource quantity, or a grace that is not a number >= 0.
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
    if plain.get(GRACE_ENV):
        pod_spec["terminationGracePeriodSeconds"] = termination_grace_period_s(grace_from_env(plain))
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
