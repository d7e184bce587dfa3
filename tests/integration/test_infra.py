"""infra/: the Kubernetes work pool base job template, the Kubernetes manifests of the jobs the kubernetes launcher
creates, the deployment definitions, the image definition, and a deployment run end to end on a `process` work pool.

There is no Kubernetes cluster here: manifests are validated against the Kubernetes API schema with
kubernetes-validate (schemas shipped in the package, offline), and the work pool is created on a real local Prefect
server (tests/_prefect.py), which stores and serves its template but starts no pod.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from _k8s_rules import job_errors, restricted_errors
from _prefect import (  # noqa: F401  (fixtures)
    deploy_local_flow,
    flow_run_logs,
    prefect_api,
    prefect_cli,
    prefect_server,
    process_worker,
    run_deployment_and_wait,
)

from mugrpo.common.preemption import GRACE_ENV
from tasks.kubernetes.manifests import build_job_manifest
from tasks.kubernetes.settings import KubernetesJobSettings
from tasks.launchers.request import JobRequest

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra"
TEMPLATE = INFRA / "base-job-template.json"
#: The newest Kubernetes API schema kubernetes-validate ships (offline).
K8S_VERSION = kubernetes_validate.utils.latest_version()
#: Keys Prefect's Kubernetes worker requires in the *pod* spec of a base job template (its manifest check demands
#: them there, though Kubernetes reads them on the Job spec and ignores them in a pod spec with a warning).
PREFECT_REQUIRED_STRAY_POD_KEYS = ("parallelism", "completions")
GPU_VALUES = {
    "image": "registry.example.com/mugrpo:gpu",
    "gpu_count": 1,
    "node_selector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "env": {"AWS_DEFAULT_REGION": "us-east-1"},
    "job_settings": {"images": {"generate": "registry.example.com/mugrpo:vllm"}, "gpus": {"generate": 2}},
}

# The example Job manifest infra/k8s/job-generate.example.yaml is generated from these (golden file).
EXAMPLE_MANIFEST = INFRA / "k8s" / "job-generate.example.yaml"
EXAMPLE_SETTINGS = KubernetesJobSettings(
    namespace="mugrpo",
    image="registry.example.com/mugrpo:cpu",
    images={"generate": "registry.example.com/mugrpo:gpu"},
    gpus={"generate": 1},
    gpu_node_selector={"nvidia.com/gpu.present": "true"},
    env={"AWS_DEFAULT_REGION": "us-east-1"},
)
EXAMPLE_REQUEST = JobRequest(
    kind="generate",
    spec_url="s3://mugrpo-runs/runs/gsm8k-smollm2/jobs/stage=0/generate.spec.json",
    timeout_s=6 * 3600,
    python="/opt/vllm/bin/python",
    env={"MUGRPO_STORAGE_OPTIONS": "{}"},
    labels={"run": "gsm8k-smollm2", "stage": "0"},
)


def validate_strict(manifest: dict) -> None:
    """Validate against the Kubernetes API schema (strict: unknown fields, typos, fail too), then the rules the API
    server enforces beyond the schema (tests/_k8s_rules.py) for Jobs."""
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    if manifest.get("kind") == "Job":
        assert job_errors(manifest) == []


def render_template(template: dict, values: dict) -> dict:
    """The Job manifest Prefect's Kubernetes worker would submit for a flow run, from the work pool's base job
    template and job variables, through the worker's own code (defaults, templating, env merge, labels)."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    properties = template["variables"]["properties"]
    variables = {k: v["default"] for k, v in properties.items() if v.get("default") is not None}
    variables.update(values)
    config = KubernetesWorkerJobConfiguration(**apply_values(copy.deepcopy(template["job_configuration"]), variables))
    config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="test-flow-run"))
    return config.job_manifest


def strip_prefect_stray_keys(manifest: dict) -> dict:
    manifest = copy.deepcopy(manifest)
    pod_spec = manifest["spec"]["template"]["spec"]
    for key in PREFECT_REQUIRED_STRAY_POD_KEYS:
        assert pod_spec.pop(key) == 1
    return manifest


def container_env(manifest: dict) -> dict[str, dict]:
    return {e["name"]: e for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]}


# ------------------------------------------------------------------------------------------- base job template
def test_base_job_template_renders_valid_jobs_with_defaults_and_gpu_values():
    template = json.loads(TEMPLATE.read_text())
    for values in ({}, GPU_VALUES):
        manifest = render_template(template, values)
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=False)
        validate_strict(strip_prefect_stray_keys(manifest))
        pod = manifest["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = container_env(manifest)
        # S3 credentials come from the Secret, by reference: no value anywhere in the template.
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            ref = {"name": "mugrpo-s3", "key": key, "optional": True}  # optional: workload identity needs none
            assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": ref}}
        assert env["HF_HOME"]["value"] == "/cache/huggingface"
        assert {"name": "hf-cache", "mountPath": "/cache/huggingface"} in container["volumeMounts"]
        assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "mugrpo-hf-cache"}} in pod["volumes"]
        assert pod["serviceAccountName"] == "mugrpo-flows"
        # The flow pod is never BestEffort, passes Pod Security "restricted", and its Job is cleaned up.
        assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
        assert container["resources"]["limits"]["memory"] == "2Gi"
        assert restricted_errors(pod) == [] and manifest["spec"]["ttlSecondsAfterFinished"] == 86400
        assert container["imagePullPolicy"] == "Always"
        assert env["MUGRPO_K8S_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        # The flow pod hands the job settings to the kubernetes launcher through its environment.
        job_settings = KubernetesJobSettings.from_env({k: e.get("value", "") for k, e in env.items()})
        assert job_settings.s3_secret_name == "mugrpo-s3" and job_settings.hf_cache_claim_name == "mugrpo-hf-cache"
        if values:
            assert job_settings.gpus == {"generate": 2}
            assert job_settings.image_for("generate") == "registry.example.com/mugrpo:vllm"
            assert job_settings.image_for("train") == GPU_VALUES["image"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert pod["nodeSelector"] == GPU_VALUES["node_selector"]
            assert pod["tolerations"] == GPU_VALUES["tolerations"]
            assert env["MUGRPO_K8S_IMAGE"]["value"] == container["image"] == GPU_VALUES["image"]
            assert env["AWS_DEFAULT_REGION"]["value"] == "us-east-1"  # deployment env merged by the worker
        else:  # the flow pod only orchestrates by default: no GPU, no node constraints
            assert job_settings == KubernetesJobSettings()
            assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
            assert "nodeSelector" not in pod and "tolerations" not in pod


def test_base_job_template_holds_no_secret_values():
    text = TEMPLATE.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{12,}", text)  # no AWS access key id
    template = json.loads(text)
    for entry in template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]["env"]:
        if entry["name"].startswith("AWS_"):
            assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], entry


def test_work_pool_created_on_a_local_prefect_server_serves_the_template(prefect_api):
    from prefect.client.orchestration import get_client
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    pool = f"mugrpo-k8s-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [prefect_cli(), "work-pool", "create", pool, "--type", "kubernetes", "--base-job-template", str(TEMPLATE)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PREFECT_API_URL": prefect_api},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with get_client(sync_client=True) as client:
        work_pool = client.read_work_pool(pool)
    assert work_pool.type == "kubernetes"
    assert work_pool.base_job_template == json.loads(TEMPLATE.read_text())

    async def worker_config():  # what a Kubernetes worker polling this pool would build for a deployment
        async with get_client() as client:
            return await KubernetesWorkerJobConfiguration.from_template_and_values(
                work_pool.base_job_template, GPU_VALUES, client=client
            )

    config = asyncio.run(worker_config())
    manifest = config.job_manifest
    validate_strict(strip_prefect_stray_keys({**manifest, "metadata": {**manifest["metadata"], "name": "x"}}))
    assert manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


# -------------------------------------------------------------------------------- job manifests of the launcher
def test_generation_job_manifest_gpu_secret_cache_and_scheduling():
    manifest = build_job_manifest(EXAMPLE_REQUEST, EXAMPLE_SETTINGS, name="mugrpo-generate-test")
    validate_strict(manifest)
    spec = manifest["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/mugrpo:gpu"
    # tini stays PID 1 (signals reach the job's process group); generate is one process even with >1 GPU (vLLM).
    assert container["command"] == [
        *("tini", "-g", "--"),
        *("/opt/vllm/bin/python", "-m", "mugrpo.jobs.generate", EXAMPLE_REQUEST.spec_url),
    ]
    # Requests = limits (Guaranteed QoS, never BestEffort), per GPU.
    assert container["resources"] == {
        "requests": {"cpu": "6", "memory": "48Gi"},
        "limits": {"cpu": "6", "memory": "48Gi", "nvidia.com/gpu": 1},
    }
    assert container["imagePullPolicy"] == "Always"  # a mutable tag
    assert restricted_errors(pod) == [] and pod["securityContext"]["fsGroup"] == 10001
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    assert spec["podReplacementPolicy"] == "Failed" and spec["ttlSecondsAfterFinished"] == 86400
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "mugrpo-s3",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    assert env["MUGRPO_STORAGE_OPTIONS"]["value"] == "{}" and env["HF_HOME"]["value"] == "/cache/huggingface"
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "mugrpo-hf-cache"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 6 * 3600
    assert manifest["metadata"]["labels"]["mugrpo/run"] == "gsm8k-smollm2"
    assert manifest["metadata"]["namespace"] == "mugrpo"


def test_cpu_job_manifest_has_no_gpu_scheduling_and_names_are_valid():
    request = JobRequest(
        kind="train",
        spec_url="s3://b/r/jobs/stage=0/train.spec.json",
        timeout_s=60.5,
        labels={"run": "A run/with odd chars!" * 5},
    )
    settings = EXAMPLE_SETTINGS.model_copy(update={"hf_cache_claim_name": None, "s3_secret_name": None})
    manifest = build_job_manifest(request, settings)
    validate_strict(manifest)
    pod = manifest["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example.com/mugrpo:cpu"
    assert container["command"][3:] == ["python", "-m", "mugrpo.jobs.train", request.spec_url]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert {"name": "hf-cache", "emptyDir": {}} in pod["volumes"]
    env = {e["name"] for e in container["env"]}
    assert "AWS_ACCESS_KEY_ID" not in env and "AWS_SECRET_ACCESS_KEY" not in env  # workload identity instead
    name = manifest["metadata"]["name"]  # deterministic: (run, stage, kind, attempt, spec hash), cut to 63
    assert re.fullmatch(r"mugrpo-a-run-with-odd-chars-[a-z0-9-]+-train-a1-[0-9a-f]{8}", name) and len(name) <= 63
    assert name == build_job_manifest(request, settings)["metadata"]["name"]
    assert len(manifest["metadata"]["labels"]["mugrpo/run"]) <= 63


def test_the_jobs_grace_sets_its_pods_termination_grace_period():
    """MUGRPO_STOP_GRACE_S in a job's env (the run flow passes it to every job) gives its pod that grace between the
    SIGTERM of an eviction or a node drain and the SIGKILL: terminationGracePeriodSeconds, whole seconds, >= 1. Without
    it the pod keeps Kubernetes' default (30 s) and the pod template its hash; a grace changes the hash (a Job of
    another grace is another pod template)."""
    plain = build_job_manifest(EXAMPLE_REQUEST, EXAMPLE_SETTINGS)
    assert "terminationGracePeriodSeconds" not in plain["spec"]["template"]["spec"]

    def with_grace(grace: str) -> dict:
        env = {**EXAMPLE_REQUEST.env, GRACE_ENV: grace}
        return build_job_manifest(dataclasses.replace(EXAMPLE_REQUEST, env=env), EXAMPLE_SETTINGS)

    hashes = {plain["metadata"]["annotations"]["mugrpo/template-hash"]}
    for grace, seconds in (("20", 20), ("19.2", 20), ("0.3", 1), ("0", 1)):
        manifest = with_grace(grace)
        validate_strict(manifest)
        assert manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == seconds
        assert container_env(manifest)[GRACE_ENV] == {"name": GRACE_ENV, "value": grace}  # the job reads it too
        hashes.add(manifest["metadata"]["annotations"]["mugrpo/template-hash"])
    assert len(hashes) == 5  # the grace (and the env that carries it) is part of the pod template
    assert "terminationGracePeriodSeconds" not in with_grace("")["spec"]["template"]["spec"]
    with pytest.raises(ValueError, match=GRACE_ENV):
        with_grace("soon")


def test_workload_identity_null_secret_in_job_settings_wins_over_the_template_variable():
    """README's workload-identity recipe: job_settings {"s3_secret_name": null, "service_account_name": ...} renders
    job pods without any Secret reference, under that service account, although the work pool's s3_secret_name
    variable keeps its default (its single-field env variable used to win over the JSON)."""
    values = {"job_settings": {"s3_secret_name": None, "service_account_name": "mugrpo-jobs"}}
    flow_manifest = render_template(json.loads(TEMPLATE.read_text()), values)
    env = container_env(flow_manifest)
    assert env["MUGRPO_K8S_S3_SECRET"]["value"] == "mugrpo-s3"  # the variable's default is still there
    settings = KubernetesJobSettings.from_env({k: e.get("value", "") for k, e in env.items()})
    assert settings.s3_secret_name is None and settings.service_account_name == "mugrpo-jobs"
    job = build_job_manifest(EXAMPLE_REQUEST, settings.model_copy(update={"image": "r/m:gpu"}))
    validate_strict(job)
    pod = job["spec"]["template"]["spec"]
    assert "secretKeyRef" not in json.dumps(job) and "AWS_ACCESS_KEY_ID" not in json.dumps(job)
    assert pod["serviceAccountName"] == "mugrpo-jobs"
    # Without the JSON field the variable applies, as before.
    env["MUGRPO_K8S_JOB_SETTINGS"]["value"] = "{}"
    assert KubernetesJobSettings.from_env({k: e.get("value", "") for k, e in env.items()}).s3_secret_name == (
        "mugrpo-s3"
    )


@pytest.mark.parametrize("kind", ["train", "segment"])
@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_multi_gpu_jobs_run_one_process_per_gpu_in_one_pod(kind, launcher):
    settings = EXAMPLE_SETTINGS.model_copy(update={"gpus": {kind: 8, "generate": 4}, "multi_gpu_launcher": launcher})
    request = JobRequest(kind=kind, spec_url=f"s3://b/r/{kind}.spec.json", timeout_s=60, python="/opt/venv/bin/python")
    manifest = build_job_manifest(request, settings)
    validate_strict(manifest)
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    launch = {
        "accelerate": ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "8", "--num_machines", "1"],
        "torchrun": ["torch.distributed.run", "--standalone", "--nproc_per_node", "8"],
    }[launcher]
    assert container["command"] == [
        *("tini", "-g", "--", "/opt/venv/bin/python", "-m"),
        *launch,
        *("-m", f"mugrpo.jobs.{kind}", request.spec_url),
    ]
    assert container["resources"]["limits"] == {"cpu": "48", "memory": "384Gi", "nvidia.com/gpu": 8}
    # One GPU: the plain command; generation shards over its GPUs inside vLLM: one process.
    one = build_job_manifest(request, settings.model_copy(update={"gpus": {kind: 1}}))
    assert one["spec"]["template"]["spec"]["containers"][0]["command"][3:] == [
        *("/opt/venv/bin/python", "-m", f"mugrpo.jobs.{kind}", request.spec_url)
    ]
    gen = build_job_manifest(EXAMPLE_REQUEST, settings)
    assert gen["spec"]["template"]["spec"]["containers"][0]["command"][3:6] == [
        "/opt/vllm/bin/python",
        "-m",
        "mugrpo.jobs.generate",
    ]


def test_image_pull_policy_follows_the_tagging_scheme():
    pinned = "registry.example.com/mugrpo@sha256:" + "a" * 64
    for image, policy in (("r/mugrpo:gpu", "Always"), (pinned, "IfNotPresent")):
        manifest = build_job_manifest(
            EXAMPLE_REQUEST, EXAMPLE_SETTINGS.model_copy(update={"images": {}, "image": image})
        )
        assert manifest["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == policy
    explicit = EXAMPLE_SETTINGS.model_copy(update={"image_pull_policy": "IfNotPresent"})
    assert (
        build_job_manifest(EXAMPLE_REQUEST, explicit)["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"]
        == "IfNotPresent"
    )


def test_api_server_rules_reject_what_the_schema_accepts():
    """Each rule of tests/_k8s_rules.py fails on a manifest the OpenAPI schema accepts: the checks can fail."""
    good = build_job_manifest(EXAMPLE_REQUEST, EXAMPLE_SETTINGS)
    assert job_errors(good) == []

    def broken(edit) -> dict:
        manifest = copy.deepcopy(good)
        edit(manifest)
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)  # the schema has no objection
        return manifest

    pod = lambda m: m["spec"]["template"]["spec"]  # noqa: E731
    cases = {
        "DNS-1123 label": lambda m: m["metadata"].update(name="Mugrpo_Train"),
        "<= 63": lambda m: m["metadata"].update(name="a" * 64),
        "label key": lambda m: m["metadata"]["labels"].update({"mugrpo/" + "k" * 64: "v"}),
        "value must be": lambda m: m["metadata"]["labels"].update({"mugrpo/run": "r" * 64}),
        "restartPolicy": lambda m: pod(m).update(restartPolicy="Always"),
        "is not a quantity": lambda m: pod(m)["containers"][0]["resources"]["requests"].update(memory="8 GB"),
        "sizeLimit": lambda m: pod(m)["volumes"][1]["emptyDir"].update(sizeLimit="16gb"),
        "secretKeyRef.name is empty": lambda m: pod(m)["containers"][0]["env"][-1]["valueFrom"]["secretKeyRef"].update(
            name=""
        ),
        "container name": lambda m: pod(m)["containers"][0].update(name="Job"),
    }
    for message, edit in cases.items():
        errors = job_errors(broken(edit))
        assert any(message in e for e in errors), (message, errors)


@pytest.mark.parametrize("kind", ["generate", "train", "eval", "segment", "some_new_kind"])
@pytest.mark.parametrize("gpus", [0, 1, 8])
def test_launcher_manifests_pass_the_api_server_rules_for_any_kind(kind, gpus):
    request = JobRequest(
        kind=kind,
        spec_url=f"s3://b/runs/x/jobs/stage=12/{kind}.spec.json",
        timeout_s=3600,
        labels={"run": "Very_Long.Run-ID " * 8, "stage": "12"},
        attempt=3,
    )
    settings = EXAMPLE_SETTINGS.model_copy(update={"gpus": {kind: gpus}})
    manifest = build_job_manifest(request, settings)
    validate_strict(manifest)
    assert restricted_errors(manifest["spec"]["template"]["spec"]) == []


def test_job_settings_from_the_flow_pod_environment():
    environ = {
        "MUGRPO_K8S_JOB_SETTINGS": json.dumps({"images": {"generate": "r/m:gpu"}, "gpus": {"generate": 2}}),
        "MUGRPO_K8S_NAMESPACE": "team-a",
        "MUGRPO_K8S_IMAGE": "r/m:cpu",
        "MUGRPO_K8S_S3_SECRET": "",  # set but empty (an unset template variable): ignored
    }
    settings = KubernetesJobSettings.from_env(environ)
    assert (settings.namespace, settings.image, settings.gpus, settings.s3_secret_name) == (
        "team-a",
        "r/m:cpu",
        {"generate": 2},
        "mugrpo-s3",
    )
    assert settings.image_for("generate") == "r/m:gpu" and settings.image_for("train") == "r/m:cpu"
    assert settings.image_for("eval") == "r/m:gpu"  # the eval job samples with the generation engine
    with pytest.raises(ValueError, match="MUGRPO_K8S_JOB_SETTINGS is not valid JSON"):
        KubernetesJobSettings.from_env({"MUGRPO_K8S_JOB_SETTINGS": "{gpus: 1"})
    with pytest.raises(ValueError, match="gpuz"):
        KubernetesJobSettings.from_env({"MUGRPO_K8S_JOB_SETTINGS": '{"gpuz": {}}'})
    with pytest.raises(ValueError, match="no image for the train job"):
        KubernetesJobSettings().image_for("train")


def test_example_job_manifest_is_what_the_launcher_builds():
    """infra/k8s/job-generate.example.yaml documents the launcher's output; regenerate it with
    MUGRPO_UPDATE_EXAMPLES=1 when build_job_manifest changes."""
    manifest = build_job_manifest(EXAMPLE_REQUEST, EXAMPLE_SETTINGS)
    header = (
        "# What the kubernetes launcher (tasks/kubernetes/manifests.py) submits for a generation job: generated by\n"
        "# tests/integration/test_infra.py from example settings (MUGRPO_UPDATE_EXAMPLES=1 rewrites it). For reading\n"
        "# and for running a job by hand: kubectl create -n mugrpo -f infra/k8s/job-generate.example.yaml\n"
    )
    text = header + yaml.safe_dump(manifest, sort_keys=False, width=120)
    if os.environ.get("MUGRPO_UPDATE_EXAMPLES") == "1":
        EXAMPLE_MANIFEST.write_text(text)
    assert EXAMPLE_MANIFEST.read_text() == text, "stale example: rerun with MUGRPO_UPDATE_EXAMPLES=1"


@pytest.mark.parametrize("path", sorted((INFRA / "k8s").glob("*.yaml")), ids=lambda p: p.name)
def test_k8s_manifests_are_valid(path):
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents
    for document in documents:
        validate_strict(document)


# ------------------------------------------------------------------------------------ deployments and the image
def test_prefect_yaml_deploys_both_flows_on_the_kubernetes_pool():
    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    deployments = {d["entrypoint"]: d for d in spec["deployments"]}
    assert set(deployments) == {"flows/run.py:run_flow", "flows/stage.py:stage_flow"}
    for d in deployments.values():
        assert d["work_pool"]["name"] == "mugrpo-k8s"
        assert d["work_pool"]["job_variables"]["image"] == "{{ $MUGRPO_IMAGE }}"
        path, _ = d["entrypoint"].split(":")
        assert (REPO_ROOT / path).is_file()
    steps = spec["pull"]
    assert steps == [{"prefect.deployments.steps.set_working_directory": {"directory": "/opt/mugrpo"}}]
    assert "WORKDIR /opt/mugrpo" in (INFRA / "Dockerfile").read_text()


def test_dockerfile_stages_copy_existing_paths_and_bake_no_credentials():
    text = (INFRA / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, flags=re.M)
    assert stages == ["base", "gpu", "cpu"]  # cpu last: the default target
    for sources in re.findall(r"^COPY (.+) \S+$", text, flags=re.M):
        for source in sources.split():
            assert (REPO_ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    assert not re.search(r"^(ENV|ARG)\s+.*(AWS_|SECRET|TOKEN|PASSWORD)", text, flags=re.M | re.I)
    # The base is pinned by digest; the GPU stage has a C compiler for Triton/vLLM kernels.
    assert re.search(r"^ARG PYTHON_IMAGE=python:[\w.-]+@sha256:[0-9a-f]{64}$", text, flags=re.M)
    gpu_stage = text.split("AS gpu", 1)[1].split("AS cpu", 1)[0]
    assert re.search(r"apt-get install .*\bgcc\b.*\blibc6-dev\b", gpu_stage)
    # prefect-kubernetes is used through its internals (the worker's config class): pinned to the tested minor.
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for req in project["optional-dependencies"]["kubernetes"]:
        assert "<" in req, f"{req}: no upper bound"
    assert 'pip install ".[demo,kubernetes]"' in gpu_stage


def test_a_deployment_runs_end_to_end_on_a_process_work_pool(process_worker, tmp_path):
    """The process_worker fixture works: a deployment of a stand-in flow runs through the real worker as a flow-run
    subprocess, and the job it launches streams its lines into the flow run's logs."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"before": ["hello from a deployed job"]}))
    deployment_id = deploy_local_flow("tests/flows_fixture.py:job_flow", name="fixture-check", pool=process_worker.pool)
    flow_run = run_deployment_and_wait(deployment_id, parameters={"spec_url": str(spec)}, timeout_s=240)
    assert flow_run.state.is_completed(), f"{flow_run.state}\n{process_worker.log_tail()}"
    logs = "\n".join(flow_run_logs(flow_run.id, wait_for="hello from a deployed job"))
    assert "[standin] hello from a deployed job" in logs, process_worker.log_tail()


def test_prefect_deploy_registers_the_infra_deployments(prefect_api):
    """`prefect deploy` reads infra/prefect.yaml as an operator would, loads both flows from their entrypoints and
    registers them on the Kubernetes work pool of the local server (no cluster: nothing runs)."""
    from prefect.client.orchestration import get_client

    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MUGRPO_IMAGE": "registry.example.com/mugrpo:test"}
    create = subprocess.run(
        [
            prefect_cli(),
            "work-pool",
            "create",
            "mugrpo-k8s",
            "--type",
            "kubernetes",
            "--base-job-template",
            str(TEMPLATE),
            "--overwrite",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert create.returncode == 0, create.stdout + create.stderr
    deploy = subprocess.run(
        [prefect_cli(), "--no-prompt", "deploy", "--all", "--prefect-file", str(INFRA / "prefect.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO_ROOT,
    )
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    with get_client(sync_client=True) as client:
        for name in ("mugrpo-run/k8s", "mugrpo-stage/k8s"):
            deployment = client.read_deployment_by_name(name)
            assert deployment.work_pool_name == "mugrpo-k8s"
            assert deployment.job_variables["image"] == "registry.example.com/mugrpo:test"
            assert deployment.pull_steps == [
                {"prefect.deployments.steps.set_working_directory": {"directory": "/opt/mugrpo"}}
            ]


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_the_rendered_multi_gpu_command_starts_one_process_per_gpu(tmp_path, launcher):
    """Runs the container command the launcher renders for 2 GPUs (without tini, which is the image's) with the
    stand-in job (tests/jobs_fixture.py) as the module: the process launcher must start 2 ranks of it on the spec.
    No GPU is needed: the stand-in touches no device."""
    spec = tmp_path / "spec.json"
    ranks_dir = tmp_path / "ranks"
    ranks_dir.mkdir()
    spec.write_text(json.dumps({"print_env": ["RANK", "WORLD_SIZE"], "env_dir": str(ranks_dir)}))
    settings = KubernetesJobSettings(image="r/m:gpu", gpus={"segment": 2}, multi_gpu_launcher=launcher, init_command=[])
    request = JobRequest(kind="segment", spec_url=str(spec), timeout_s=60, module="jobs_fixture", python=sys.executable)
    (container,) = build_job_manifest(request, settings)["spec"]["template"]["spec"]["containers"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "tests"), "ACCELERATE_USE_CPU": "true"}
    proc = subprocess.run(container["command"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # each rank writes its environment to a file: torchrun relays its workers' stdout through log tailers, which
    # can drop a worker's last lines when the agent exits right after the workers (seen once in CI)
    written = sorted(f.read_text() for f in ranks_dir.glob("rank-*.txt"))
    assert written == ["RANK=0\nWORLD_SIZE=2\n", "RANK=1\nWORLD_SIZE=2\n"], proc.stdout + proc.stderr


def test_multi_node_training_is_an_indexed_job_with_a_headless_service():
    """settings.nodes = {train: 2}: an Indexed Job of 2 pods (completions = parallelism = 2), each a torchrun node
    whose rank is its completion index (downward API, expanded by the kubelet in the command) and whose rendezvous is
    pod 0 through the headless Service of the Job's name. Both manifests pass the API schema (strict)."""
    from tasks.kubernetes.manifests import build_rendezvous_service

    settings = EXAMPLE_SETTINGS.model_copy(update={"gpus": {"train": 8}, "nodes": {"train": 2}})
    request = JobRequest(
        kind="train", spec_url="s3://b/r/jobs/stage=3/train.spec.json", timeout_s=60, python="/opt/venv/bin/python"
    )
    job = build_job_manifest(request, settings)
    validate_strict(job)
    name, spec = job["metadata"]["name"], job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        2,
        2,
        0,
    )
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == name
    (container,) = pod["containers"]
    assert container["command"] == [
        *("tini", "-g", "--", "/opt/venv/bin/python", "-m", "torch.distributed.run"),
        *("--nnodes", "2", "--nproc_per_node", "8", "--node_rank", "$(MUGRPO_NODE_RANK)", "--rdzv_backend", "static"),
        *("--master_addr", f"{name}-0.{name}", "--master_port", "29500", "-m", "mugrpo.jobs.train", request.spec_url),
    ]
    rank = next(e for e in container["env"] if e["name"] == "MUGRPO_NODE_RANK")
    assert (
        rank["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8  # per pod: 2 x 8 GPUs
    service = build_rendezvous_service(job, owner_uid="0f0e")
    validate_strict(service)
    assert service["metadata"]["name"] == name and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    assert service["metadata"]["ownerReferences"][0]["uid"] == "0f0e"
    assert build_rendezvous_service(build_job_manifest(request, EXAMPLE_SETTINGS)) is None  # one pod: no Service
    # Generation scales out with generation.workers, not with nodes.
    with pytest.raises(ValueError, match="generation.workers"):
        build_job_manifest(
            JobRequest(kind="generate", spec_url="s3://b/g.json", timeout_s=60),
            EXAMPLE_SETTINGS.model_copy(update={"nodes": {"generate": 2}}),
        )


def test_fsdp_arguments_reach_the_accelerate_launch_of_a_one_pod_job():
    """launcher_args: FSDP on one pod's GPUs through accelerate (FSDP has not run on a GPU here: no GPU is lent)."""
    fsdp = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_state_dict_type", "FULL_STATE_DICT"]
    settings = EXAMPLE_SETTINGS.model_copy(update={"gpus": {"train": 4}, "launcher_args": {"train": fsdp}})
    request = JobRequest(kind="train", spec_url="s3://b/t.json", timeout_s=60, python="/opt/venv/bin/python")
    job = build_job_manifest(request, settings)
    validate_strict(job)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--num_machines") + 2 : command.index("-m", command.index("--num_machines"))] == fsdp
