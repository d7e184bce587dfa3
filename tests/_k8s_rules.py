"""Rules the Kubernetes API server enforces on a Job that its OpenAPI schema (kubernetes-validate) does not:
DNS-1123 names, label syntax and length, a Job's restartPolicy, resource quantities, non-empty Secret names.
Taken from k8s.io/apimachinery validation (IsDNS1123Label/Subdomain, IsQualifiedName, IsValidLabelValue),
resource.ParseQuantity and the batch/v1 Job validation."""

from __future__ import annotations

import re
from typing import Any

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")


def _label(value: str, what: str) -> list[str]:
    if len(value) > 63 or not DNS1123_LABEL.fullmatch(value):
        return [f"{what} {value!r} is not a DNS-1123 label (<= 63 of [a-z0-9-], alphanumeric ends)"]
    return []


def _subdomain(value: str, what: str) -> list[str]:
    if not value:
        return [f"{what} is empty"]
    if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value):
        return [f"{what} {value!r} is not a DNS-1123 subdomain"]
    return []


def _labels(labels: dict[str, Any], where: str) -> list[str]:
    errors = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if prefix:
            errors += _subdomain(prefix, f"{where} label key prefix")
        if len(name) > 63 or not QUALIFIED_NAME.fullmatch(name):
            errors.append(f"{where} label key {key!r} is not a qualified name (<= 63 chars)")
        if not isinstance(value, str) or len(value) > 63 or (value and not QUALIFIED_NAME.fullmatch(value)):
            errors.append(f"{where} label {key}={value!r}: value must be <= 63 of [A-Za-z0-9_.-], alphanumeric ends")
    return errors


def _quantities(resources: dict[str, Any], where: str) -> list[str]:
    errors = []
    for section, values in (resources or {}).items():
        for name, value in (values or {}).items():
            if not QUANTITY.fullmatch(str(value)):
                errors.append(f"{where} resources.{section}.{name}: {value!r} is not a quantity")
    requests, limits = (resources or {}).get("requests", {}), (resources or {}).get("limits", {})
    for name in ("nvidia.com/gpu",):
        if name in requests and name in limits and str(requests[name]) != str(limits[name]):
            errors.append(f"{where} {name}: requests must equal limits for extended resources")
    return errors


def _secret_refs(node: Any, where: str) -> list[str]:
    """Every secretKeyRef / secretRef / secret volume names a non-empty Secret."""
    errors = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(value, dict):
                errors += _subdomain(value.get("name") or "", f"{where} {key}.name")
            elif key == "secret" and isinstance(value, dict):
                errors += _subdomain(value.get("secretName") or "", f"{where} secret volume secretName")
            else:
                errors += _secret_refs(value, where)
    elif isinstance(node, list):
        for item in node:
            errors += _secret_refs(item, where)
    return errors


def job_errors(job: dict) -> list[str]:
    """What the API server would reject in a batch/v1 Job manifest, beyond its schema (empty: accepted)."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    errors = []
    name = meta.get("name") or ""
    # The Job controller labels pods job-name=NAME (a label value): Job names beyond 63 characters are rejected.
    errors += _label(name, "Job name") if name else ([] if meta.get("generateName") else ["Job has no name"])
    if meta.get("namespace"):
        errors += _label(meta["namespace"], "namespace")
    errors += _labels(meta.get("labels"), "Job")
    template = spec.get("template") or {}
    errors += _labels((template.get("metadata") or {}).get("labels"), "pod template")
    pod = template.get("spec") or {}
    policy = pod.get("restartPolicy")
    if policy not in ("Never", "OnFailure"):
        errors.append(f"Job pod restartPolicy must be Never or OnFailure, got {policy!r}")
    if spec.get("podFailurePolicy") and policy != "Never":
        errors.append("a podFailurePolicy needs restartPolicy Never")
    if pod.get("serviceAccountName") is not None:
        errors += _subdomain(pod["serviceAccountName"], "serviceAccountName")
    for c in pod.get("containers") or []:
        errors += _label(c.get("name", ""), "container name")
        errors += _quantities(c.get("resources"), f"container {c.get('name')}")
        for e in c.get("env") or []:
            if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", e.get("name", "")):
                errors.append(f"env name {e.get('name')!r} is not a valid environment variable name")
    for v in pod.get("volumes") or []:
        errors += _label(v.get("name", ""), "volume name")
        size = (v.get("emptyDir") or {}).get("sizeLimit")
        if size is not None and not QUANTITY.fullmatch(str(size)):
            errors.append(f"volume {v.get('name')} sizeLimit {size!r} is not a quantity")
        claim = v.get("persistentVolumeClaim")
        if claim is not None:
            errors += _subdomain(claim.get("claimName") or "", f"volume {v.get('name')} claimName")
    errors += _secret_refs(pod, "pod")
    return errors


def restricted_errors(pod: dict) -> list[str]:
    """Violations of Pod Security Standard "restricted" (the checks that apply to these pods)."""
    errors = []
    pod_sc = pod.get("securityContext") or {}
    for c in pod.get("containers") or []:
        sc = c.get("securityContext") or {}
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            errors.append(f"{c['name']}: runAsNonRoot must be true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            errors.append(f"{c['name']}: runAsUser 0")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            errors.append(f"{c['name']}: capabilities must drop ALL")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            errors.append(f"{c['name']}: seccompProfile must be RuntimeDefault or Localhost")
    allowed = {"name", "persistentVolumeClaim", "emptyDir", "configMap", "secret", "projected", "downwardAPI"}
    for v in pod.get("volumes") or []:
        if set(v) - allowed:
            errors.append(f"volume {v['name']}: type {set(v) - allowed} not allowed")
    return errors
