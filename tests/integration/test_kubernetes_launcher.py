"""The kubernetes launcher against a scripted fake Kubernetes API (tests/_fake_k8s.py).

No cluster exists here. Each test starts an HTTP server on 127.0.0.1 that plays the Kubernetes API (Jobs, pods,
pod logs, events) and points ``KUBECONFIG`` at it; the launcher runs unchanged: the real ``kubernetes_asyncio``
client loads the kubeconfig and speaks HTTP to the fake, and the launcher's own create/re-attach logic and watch
loop (tasks/kubernetes/objects.py, tasks/kubernetes/watch.py) run for real. Poll intervals are cut to a few
hundredths of a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fake_k8s import FakeKubernetes, Fault, Plan

from tasks.kubernetes.launcher import KubernetesLauncher
from tasks.kubernetes.manifests import build_job_manifest
from tasks.kubernetes.settings import KubernetesJobSettings
from tasks.launchers.errors import JobFailedError, JobLaunchError, JobTimeoutError
from tasks.launchers.protocol import launch_job
from tasks.launchers.request import JobRequest

pytestmark = pytest.mark.waits  # run first, it mostly waits: outages, pending pods and deadlines are polled out

JOBS = r"/apis/batch/v1/namespaces/mugrpo/jobs"
FAST = {
    "poll_interval_s": 0.05,
    "pending_timeout_s": 0.6,
    "api_retry_window_s": 2.0,
    "api_backoff_max_s": 0.05,
    "delete_wait_s": 5.0,
}
SETTINGS = KubernetesJobSettings(namespace="mugrpo", image="r/mugrpo:gpu", **FAST)


def request(attempt: int = 1, **kw) -> JobRequest:
    return JobRequest(
        kind=kw.pop("kind", "train"),
        spec_url=kw.pop("spec_url", "s3://b/runs/r1/jobs/stage=0/train.spec.json"),
        timeout_s=kw.pop("timeout_s", 600),
        labels={"run": "r1", "stage": "0"},
        attempt=attempt,
        **kw,
    )


@pytest.fixture
def k8s(tmp_path, monkeypatch):
    """Factory: a started fake API serving ``plan`` for new Jobs, with KUBECONFIG pointing at it."""
    servers = []

    def start(plan: Plan | None = None) -> FakeKubernetes:
        fake = FakeKubernetes(plan).__enter__()
        servers.append(fake)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
        return fake

    yield start
    for fake in servers:
        fake.__exit__(None, None, None)


def run(req: JobRequest | None = None, settings: KubernetesJobSettings = SETTINGS):
    lines: list[str] = []
    result = launch_job(req or request(), KubernetesLauncher(settings), on_line=lines.append)
    return result, lines


def job_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("step")]


# ---------------------------------------------------------------------------------------- 1. transient API errors
def test_a_503_and_a_404_watch_race_do_not_kill_a_healthy_job(k8s):
    fake = k8s(Plan(lines=[f"step {i}" for i in range(4)]))
    name = build_job_manifest(request(), SETTINGS)["metadata"]["name"]
    fake.faults = [
        Fault("POST", JOBS + "$", 503),  # the create itself is retried
        Fault("GET", f"{JOBS}/{name}$", 503),
        Fault("GET", f"{JOBS}/{name}$", 404),  # a cache race: the Job we created is "not found" once
        Fault("GET", "/pods$", 503),
    ]
    result, lines = run()
    assert result.exit_code == 0 and result.job_id == f"mugrpo/{name}"
    assert job_lines(lines) == [f"step {i}" for i in range(4)]
    assert not fake.calls("DELETE", JOBS)  # nothing deleted the healthy Job
    assert len(fake.calls("POST", JOBS)) == 2
    assert any("503" in line and "retrying" in line for line in lines)
    assert any("not found; checking again" in line for line in lines)


def test_an_api_outage_fails_the_attempt_without_deleting_and_the_next_attempt_reattaches(k8s):
    fake = k8s(Plan(lines=["step 0", "step 1"]))
    fake.faults = [Fault("GET", "/pods$", 503, times=10_000)]
    with pytest.raises(JobLaunchError, match="kept failing") as err:
        run()
    assert err.value.transient  # Prefect retries it
    assert not fake.calls("DELETE", JOBS) and len(fake.jobs) == 1
    fake.faults.clear()
    result, lines = run(request(attempt=2))  # the retry: same spec, a different attempt name
    assert result.exit_code == 0 and job_lines(lines) == ["step 0", "step 1"]
    assert len(fake.calls("POST", JOBS)) == 1  # re-attached, not relaunched
    assert any("re-attaching to the running Kubernetes Job" in line for line in lines)


# --------------------------------------------------------------------------------------- 2. pods that never start
def test_pods_that_cannot_be_created_are_polled_at_a_bounded_rate_and_fail_with_the_jobs_events(k8s):
    quota = 'pods "x" is forbidden: exceeded quota: gpu-quota, requested: nvidia.com/gpu=8, limited: 4'
    fake = k8s(Plan(no_pod=True, events=[("FailedCreate", f"Error creating: {quota}")]))
    with pytest.raises(JobFailedError) as err:
        run()
    assert "pending timeout" in str(err.value) and "exceeded quota" in str(err.value)
    reads = len(fake.calls("GET", f"{JOBS}/"))
    # One read per poll interval until the pending timeout (+ the first read and the final check).
    assert reads <= FAST["pending_timeout_s"] / FAST["poll_interval_s"] + 3
    assert len(fake.calls("DELETE", JOBS)) == 1  # we decided to stop it


@pytest.mark.parametrize(
    ("reason", "message", "event"),
    [
        ("ImagePullBackOff", 'Back-off pulling image "r/mugrpo:gpu"', "Failed to pull image: not found"),
        ("CreateContainerConfigError", 'secret "mugrpo-s3" not found', 'Error: secret "mugrpo-s3" not found'),
    ],
)
def test_pending_pods_fail_fast_with_their_waiting_reason_and_events(k8s, reason, message, event):
    fake = k8s(Plan(waiting=(reason, message), events=[("Failed", event)]))
    with pytest.raises(JobFailedError) as err:
        run()
    text = str(err.value)
    assert reason in text and message in text and event in text
    assert f"{reason}: {message}" in err.value.last_lines[-2]  # surfaced in the task log as it happened
    assert len(fake.calls("DELETE", JOBS)) == 1


# ------------------------------------------------------------------------------------------------- 3. re-attach
def test_resume_reattaches_to_the_running_job_of_the_same_spec(k8s):
    fake = k8s()
    previous = build_job_manifest(request(attempt=2), SETTINGS)  # the dead flow pod's second attempt
    fake.add_job(previous, Plan(lines=["step 7", "step 8"]))
    result, lines = run(request(attempt=1))
    assert result.job_id == f"mugrpo/{previous['metadata']['name']}"
    assert job_lines(lines) == ["step 7", "step 8"]
    assert not fake.calls("POST", JOBS) and not fake.calls("DELETE", JOBS)


def test_a_prestarted_job_is_created_ahead_and_its_run_reattaches_to_it(k8s):
    """Pre-starting (orchestration.prestart_jobs) creates the Job while the job before it runs: its pod starts and
    waits at its start gate; the run of the same request follows that Job, creating none."""
    fake = k8s(Plan(lines=["step 0", "step 1"]))
    launcher = KubernetesLauncher(SETTINGS)
    assert launcher.prestart(request())
    assert len(fake.calls("POST", JOBS)) == 1
    result, lines = run(request())
    assert result.exit_code == 0 and job_lines(lines) == ["step 0", "step 1"]
    assert len(fake.calls("POST", JOBS)) == 1 and not fake.calls("DELETE", JOBS)
    assert launcher.discard_prestarted() == 0  # followed: nothing left to stop


def test_prestarted_jobs_nobody_followed_are_deleted(k8s):
    fake = k8s(Plan(lines=["step 0"], hang=True))
    launcher = KubernetesLauncher(SETTINGS)
    launcher.prestart(request(kind="generate", spec_url="s3://b/runs/r1/jobs/stage=1/generate.spec.json"))
    assert launcher.discard_prestarted({"run": "other"}) == 0
    assert launcher.discard_prestarted({"run": "r1"}) == 1
    assert len(fake.calls("DELETE", JOBS)) == 1


def test_a_failed_job_of_the_same_name_is_replaced_only_after_it_is_gone(k8s):
    fake = k8s(Plan(lines=["step 0"]))
    manifest = build_job_manifest(request(), SETTINGS)
    name = manifest["metadata"]["name"]
    fake.add_job(manifest, Plan(lines=["old"]), state="failed")
    result, lines = run()
    assert result.exit_code == 0 and job_lines(lines) == ["step 0"]
    order = [(m, p) for m, p, _ in fake.requests if p.startswith(f"{JOBS}/{name}") or p == JOBS]
    delete = order.index(("DELETE", f"{JOBS}/{name}"))
    post = order.index(("POST", JOBS))
    assert delete < post
    # Between them: reads that still found the Job (pods terminating), then the 404 that let us create.
    assert len([r for r in order[delete:post] if r[0] == "GET"]) == fake.reads_until_gone + 1


def test_an_active_job_of_the_same_spec_but_another_template_is_stopped_before_the_new_one(k8s):
    fake = k8s(Plan(lines=["step 0"]))
    stale = build_job_manifest(request(), SETTINGS.model_copy(update={"image": "r/mugrpo:old"}))
    stale["metadata"]["name"] = "mugrpo-r1-s0-train-a1-stale"
    fake.add_job(stale, Plan(lines=["old"]))
    result, lines = run()
    assert result.exit_code == 0
    methods = [m for m, p, _ in fake.requests if p in (JOBS, f"{JOBS}/mugrpo-r1-s0-train-a1-stale")]
    assert methods.index("DELETE") < methods.index("POST")


def test_an_interrupted_task_deletes_its_job(k8s):
    fake = k8s(Plan(lines=["step 0", "step 1"]))

    def interrupt(line: str) -> None:
        if line.startswith("step"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        KubernetesLauncher(SETTINGS).run(request(), interrupt)
    assert len(fake.calls("DELETE", JOBS)) == 1


def test_a_job_failure_reports_the_containers_exit_code(k8s):
    k8s(Plan(lines=["usage: bad spec"], exit_code=2))
    with pytest.raises(JobFailedError) as err:
        run()
    assert err.value.exit_code == 2 and not err.value.transient
    assert "BackoffLimitExceeded" in str(err.value)


def test_a_job_killed_at_its_deadline_by_the_cluster_is_a_timeout(k8s):
    k8s(Plan(lines=["step 0"], exit_code=137, fail_reason="DeadlineExceeded"))
    with pytest.raises(JobTimeoutError) as err:
        run()
    assert err.value.transient and err.value.last_lines[-1] == "step 0"


def test_the_watch_deletes_a_job_running_past_its_timeout(k8s):
    fake = k8s(Plan(lines=["step 0"], hang=True))
    with pytest.raises(JobTimeoutError) as err:
        run(request(timeout_s=0.3))
    assert "step 0" in err.value.last_lines
    assert len(fake.calls("DELETE", JOBS)) == 1


# ------------------------------------------------------------------------------------------ 4. workload identity
def test_a_null_secret_in_job_settings_creates_job_pods_without_secret_refs(k8s, monkeypatch):
    """The flow pod's environment as the work pool template writes it: the single-field variable still names the
    default Secret, job_settings says null: the Job the fake API receives references no Secret and runs under the
    given service account."""
    fake = k8s(Plan(lines=["step 0"]))
    monkeypatch.setenv("MUGRPO_K8S_S3_SECRET", "mugrpo-s3")
    monkeypatch.setenv("MUGRPO_K8S_IMAGE", "r/mugrpo:gpu")
    monkeypatch.setenv("MUGRPO_K8S_NAMESPACE", "mugrpo")
    settings = {"s3_secret_name": None, "service_account_name": "mugrpo-jobs", **FAST}  # Prefect writes a repr
    monkeypatch.setenv("MUGRPO_K8S_JOB_SETTINGS", repr(settings) + " ")
    result = launch_job(request(), KubernetesLauncher())
    assert result.exit_code == 0
    (created,) = fake.jobs.values()
    pod = created["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "mugrpo-jobs"
    assert "secretKeyRef" not in json.dumps(created) and "AWS_SECRET_ACCESS_KEY" not in json.dumps(created)


# ------------------------------------------------------------------------------------------------------ 7. logs
def test_a_dropped_log_stream_resumes_from_the_last_line_seen(k8s):
    steps = [f"step {i}" for i in range(8)]  # 0.3 s apart: several lines share each second of sinceTime
    fake = k8s(Plan(lines=steps, drop_after=5))
    result, lines = run()
    assert job_lines(lines) == steps  # every line once, in order
    streams = fake.calls("GET", "/log$")
    assert "sinceTime" not in streams[0][2]
    assert streams[1][2]["sinceTime"] == "2026-11-30T10:00:01Z"  # the second of line 4 (1.2 s)
    assert result.exit_code == 0


# ------------------------------------------------------------------------------------------------------- RBAC
def rbac_grants() -> set[tuple[str, str]]:
    import yaml

    from tasks.kubernetes.launcher import __file__ as k8s_module

    path = Path(k8s_module).resolve().parents[2] / "infra" / "k8s" / "rbac.yaml"
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Role"]
    return {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}


def used_permissions(fake: FakeKubernetes) -> set[tuple[str, str]]:
    used = set()
    for method, path, _ in fake.requests:
        parts = path.strip("/").split("/")  # api/v1/namespaces/NS/RES[/NAME[/SUB]] or apis/G/V/namespaces/...
        rest = parts[parts.index("namespaces") + 2 :]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        verb = {"POST": "create", "DELETE": "delete"}.get(method) or ("get" if len(rest) > 1 else "list")
        used.add((resource, verb))
    return used


def test_rbac_grants_exactly_the_verbs_the_launcher_uses(k8s):
    """infra/k8s/rbac.yaml against the requests the launcher made to the fake API over its scenarios: nothing it
    needs is missing (a 403 on a cluster), nothing it never uses is granted."""
    fake = k8s(Plan(lines=["step 0"]))
    fake.add_job(build_job_manifest(request(), SETTINGS), Plan(lines=["old"]), state="failed")
    run()  # list, replace (delete, get until gone), create, poll, pods, logs
    assert run(request(attempt=2))[0].exit_code == 0  # a succeeded Job of the same spec: re-attached
    fake.plan = Plan(waiting=("ImagePullBackOff", "Back-off"), events=[("Failed", "pull")])
    with pytest.raises(JobFailedError):
        run(request(spec_url="s3://b/runs/r1/jobs/stage=1/train.spec.json"))  # events of a pending pod
    fake.plan = Plan(lines=["step 0"])
    multi = SETTINGS.model_copy(update={"nodes": {"train": 2}})
    run(request(spec_url="s3://b/runs/r1/jobs/stage=2/train.spec.json"), settings=multi)  # its headless Service
    assert used_permissions(fake) == rbac_grants()


# ------------------------------------------------------------------------------------ multi-node training
def test_a_multi_node_train_job_gets_its_rendezvous_service_and_both_pods_are_followed(k8s):
    """settings.nodes = {train: 2}: one Indexed Job of 2 pods, then a headless Service owned by it; the launcher
    follows the logs of both pods. (A fake API: no cluster here, so nothing resolves the pods' DNS names.)"""
    fake = k8s(Plan(lines=["step 0", "step 1"]))
    settings = SETTINGS.model_copy(update={"nodes": {"train": 2}, "gpus": {"train": 8}})
    result, lines = run(settings=settings)
    assert result.exit_code == 0
    (name,) = fake.jobs
    job = fake.jobs[name]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    service = fake.services[name]
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["ownerReferences"][0] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": f"uid-{name}",
        "blockOwnerDeletion": False,
    }
    assert job_lines(lines) == ["step 0", "step 1"] * 2  # one stream per pod
    assert any("created headless Service" in line for line in lines)
    # A retry of the attempt re-attaches to the Job and keeps its Service (409).
    result, lines = run(request(attempt=2), settings=settings)
    assert result.exit_code == 0 and len(fake.calls("POST", r"/services$")) == 2 and len(fake.services) == 1
    assert any("kept the existing headless Service" in line for line in lines)
