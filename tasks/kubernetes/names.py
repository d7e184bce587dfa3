"""The Kubernetes names and label values of a job: DNS-1123 labels, label values and the deterministic Job name."""

from __future__ import annotations

import hashlib
import re

from tasks.launchers.request import JobRequest

#: Label of a Job naming its spec (sha256 of the spec URL, 16 hex): one active Job per spec.
SPEC_LABEL = "mugrpo/spec"
_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def k8s_name(*parts: str, max_len: int = 63) -> str:
    """A DNS-1123 label from ``parts`` (lowercase alphanumerics and '-', <= ``max_len`` chars)."""
    name = _DNS_LABEL_BAD.sub("-", "-".join(parts).lower()).strip("-")
    return name[:max_len].rstrip("-") or "job"


def k8s_label_value(value: str) -> str:
    """A valid label value (<= 63 chars of ``[A-Za-z0-9_.-]``, alphanumeric at both ends)."""
    return _LABEL_VALUE_BAD.sub("-", value)[:63].strip("-_.")


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
