"""What a Kubernetes Job and its pods say about the job: finished or active, the job container's state, its exit
code, why a pod has not started, whether it was disrupted (evicted, preempted, drained), the last Warning events."""

from __future__ import annotations

#: Label the Job controller puts on the pods of a Job.
JOB_NAME_LABEL = "job-name"
#: Name of the job container in the pod (tasks.kubernetes.manifests.build_job_manifest).
CONTAINER = "job"


# ------------------------------------------------------------------------------------------------- job state
def job_finished(job: dict) -> tuple[str, str] | None:
    """``("Complete" | "Failed", "reason: message")`` once the Job has that condition, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"], f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return None


def job_active(job: dict) -> bool:
    """Not finished and not being deleted."""
    return job_finished(job) is None and not (job.get("metadata") or {}).get("deletionTimestamp")


def container_state(pod: dict) -> dict:
    """``state`` of the job container (``{}`` before the kubelet reports it)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status.get("state") or {}
    return {}


def pod_started(pod: dict) -> bool:
    """The container runs or ran: its log can be read."""
    state = container_state(pod)
    return "running" in state or "terminated" in state


def disruption(pod: dict) -> str | None:
    """Why the pod was disrupted: the reason of its ``DisruptionTarget`` condition (``EvictionByEvictionAPI``,
    ``PreemptionByScheduler``, ``DeletionByTaintManager``, ``TerminationByKubelet``...), ``"disrupted"`` when it
    gives none; None when the pod has no such condition. A Job's ``podFailurePolicy`` ignores the failure of a pod
    with that condition, and the Job controller replaces it."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return cond.get("reason") or "disrupted"
    return None


def exit_code(pods: list[dict]) -> int | None:
    """Exit code of the newest terminated job container, None if none terminated."""
    codes = [
        (p["metadata"].get("creationTimestamp") or "", container_state(p)["terminated"].get("exitCode"))
        for p in pods
        if "terminated" in container_state(p)
    ]
    return max(codes)[1] if codes else None


def pending_reason(pod: dict) -> str:
    """Why a pod's container has not started: waiting reason and message, else the PodScheduled condition."""
    waiting = container_state(pod).get("waiting")
    if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
        return f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip(": ")
    if waiting:
        return waiting["reason"]
    return (pod.get("status") or {}).get("phase") or "Pending"


def describe_events(events: dict, limit: int = 3) -> str:
    """The last ``limit`` Warning events (``reason: message``, repeats collapsed) of an event list."""
    items = [e for e in events.get("items") or [] if e.get("type") == "Warning"]
    items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    seen: list[str] = []
    for e in items:
        text = f"{e.get('reason', '')}: {e.get('message', '')}"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen[-limit:])
