"""Preemption on Kubernetes: an evicted job pod against the fake Kubernetes API (tests/_fake_k8s.py).

No cluster exists here. The fake plays the Eviction API and the Job controller: an evicted pod gets the condition
``DisruptionTarget``, its container its SIGTERM, and, the Job's ``podFailurePolicy`` ignoring the failure of such a
pod, a replacement pod runs. The launcher (tasks/kubernetes/watch.py) runs unchanged on the real
``kubernetes_asyncio`` client: it says the pod was evicted, follows the replacement and ends with the Job's result;
a Job that fails with exit code 75 (the job saved its work, :mod:`mugrpo.common.preemption`) is a preemption
(:class:`JobPreemptedError`, transient), not a failure.

Most scenarios are scripted (the container's lines and exit code come from the plan). The last two run a job for
real: the fake kubelet runs the container's command as a local process (this module, a stand-in job that installs
the real :class:`PreemptionNotice`), sends it SIGTERM on the eviction and SIGKILL once the pod's
``terminationGracePeriodSeconds`` (set from ``MUGRPO_STOP_GRACE_S``) has passed.

Run as ``python -m test_k8s_eviction SPEC.json`` this module is that stand-in job (:func:`preemptible_job`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from _fake_k8s import FakeKubernetes, Plan

from mugrpo.common.preemption import GRACE_ENV, PREEMPTED_EXIT_CODE, PreemptionNotice
from tasks.kubernetes.launcher import KubernetesLauncher
from tasks.kubernetes.settings import KubernetesJobSettings
from tasks.launchers.errors import JobFailedError, JobPreemptedError
from tasks.launchers.protocol import Launcher, describe_exit, launch_job
from tasks.launchers.request import JobRequest, LaunchOutcome

TESTS_DIR = Path(__file__).resolve().parents[1]
JOBS = r"/apis/batch/v1/namespaces/mugrpo/jobs"
FAST = {
    "poll_interval_s": 0.05,
    "pending_timeout_s": 5.0,
    "api_retry_window_s": 2.0,
    "api_backoff_max_s": 0.05,
    "delete_wait_s": 5.0,
}
SETTINGS = KubernetesJobSettings(namespace="mugrpo", image="r/mugrpo:gpu", **FAST)
REPLACED = "the Job controller replaces it; the job resumes from its saved work"


def request(**kw) -> JobRequest:
    return JobRequest(
        kind="train",
        spec_url=kw.pop("spec_url", "s3://b/runs/r1/jobs/stage=0/train.spec.json"),
        timeout_s=kw.pop("timeout_s", 600),
        labels={"run": "r1", "stage": "0"},
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


def run(req: JobRequest | None = None, lines: list[str] | None = None):
    lines = [] if lines is None else lines
    return launch_job(req or request(), KubernetesLauncher(SETTINGS), on_line=lines.append), lines


def pods_in_order(fake: FakeKubernetes) -> list[str]:
    return sorted(fake.pods, key=lambda p: fake.pods[p]["metadata"]["creationTimestamp"])


# ------------------------------------------------------------------------------------------ exit code 75
class _Outcome(Launcher):
    """A launcher that prints ``lines`` and reports ``outcome``."""

    name = "scripted"

    def __init__(self, outcome: LaunchOutcome, lines: list[str]):
        self.outcome, self.lines = outcome, lines

    def run(self, request: JobRequest, on_line) -> LaunchOutcome:
        for line in self.lines:
            on_line(line)
        return self.outcome


def test_exit_code_75_is_a_preemption_and_other_codes_stay_failures():
    assert describe_exit(PREEMPTED_EXIT_CODE) == "preempted (exit code 75)"
    assert describe_exit(3) == "exit code 3" and describe_exit(-9) == "killed by SIGKILL"
    said = ["update 3", "preempted: saved update 3 (predicted 2.0 s, 20.0 s of the grace left)", "bye"]
    with pytest.raises(JobPreemptedError) as err:
        launch_job(request(), _Outcome(LaunchOutcome(75, "ns/j", detail="Job failed: x"), said))
    e = err.value
    assert isinstance(e, JobFailedError) and e.transient and e.exit_code == 75 and e.notice == said[1]
    assert e.summary.startswith("train job ns/j (scripted, spec s3://b/runs/r1/jobs/stage=0/train.spec.json) ")
    assert " preempted after " in e.summary
    assert e.summary.endswith(f"s (SIGTERM): saved its work; a re-run resumes from it; {said[1]}; Job failed: x")
    assert e.last_lines == tuple(said) and e.refusal is None
    with pytest.raises(JobPreemptedError) as err:  # no "preempted:" line: the summary says what it knows
        launch_job(request(), _Outcome(LaunchOutcome(75, "ns/j"), ["update 3"]))
    assert err.value.notice == "" and err.value.summary.endswith("saved its work; a re-run resumes from it")
    for code, transient in ((3, True), (2, False), (None, True)):
        with pytest.raises(JobFailedError) as err:
            launch_job(request(), _Outcome(LaunchOutcome(code, "ns/j"), ["preempted: not really"]))
        assert type(err.value) is JobFailedError and err.value.transient is transient
        assert " failed after " in err.value.summary


# ------------------------------------------------------------------------------------------ scripted evictions
def test_an_evicted_pod_is_replaced_and_the_job_ends_with_the_replacements_result(k8s):
    """A pod evicted while its Job runs: one line says so, the replacement's log follows the evicted pod's, and the
    Job's success is the attempt's result. Nothing is deleted or created by the launcher."""
    fake = k8s(
        Plan(
            lines=["step 0", "step 1", "step 2", "preempted: saved update 2"],
            evict_after=3,
            replacement=Plan(lines=["resumed from update 2", "step 3"]),
        )
    )
    result, lines = run()
    assert result.exit_code == 0
    evicted, replacement = pods_in_order(fake)
    assert fake.pods[evicted]["metadata"]["labels"] == fake.pods[replacement]["metadata"]["labels"]
    assert fake.pods[evicted]["status"]["phase"] == "Failed"
    assert lines.count(f"pod {evicted} evicted (EvictionByEvictionAPI); {REPLACED}") == 1
    job = [line for line in lines if line.startswith(("step", "preempted", "resumed"))]
    assert job == ["step 0", "step 1", "step 2", "preempted: saved update 2", "resumed from update 2", "step 3"]
    assert len(fake.calls("POST", JOBS)) == 1 and not fake.calls("DELETE", JOBS)


@pytest.mark.parametrize("again", [False, True], ids=["not-replaced", "replacement-evicted-too"])
def test_a_job_that_fails_after_an_eviction_with_exit_code_75_is_a_preemption(k8s, again):
    """The Job ends Failed with the evicted pod's exit code 75 (no replacement: a cluster whose Job controller does
    not honour podFailurePolicy; or the replacement evicted in its turn): JobPreemptedError, transient, naming the
    eviction and what the job saved."""
    last = Plan(lines=["step 0", "preempted: saved update 1"], evict_after=1)
    plan = Plan(lines=["resumed from update 0", "step 5"], evict_after=1, replacement=last) if again else last
    fake = k8s(plan)
    with pytest.raises(JobPreemptedError) as err:
        run()
    e = err.value
    assert e.transient and e.exit_code == 75 and e.notice == "preempted: saved update 1"
    pods = pods_in_order(fake)
    assert f"pod {pods[-1]} evicted (EvictionByEvictionAPI)" in e.summary and "Job failed: " in e.summary
    assert "(SIGTERM): saved its work; a re-run resumes from it; preempted: saved update 1" in e.summary
    said = [line for line in e.last_lines if " evicted " in line]
    assert said == ([f"pod {pods[0]} evicted (EvictionByEvictionAPI); {REPLACED}"] if again else [])


def test_a_replacement_that_fails_is_a_failure(k8s):
    k8s(Plan(lines=["step 0"], evict_after=1, replacement=Plan(lines=["Traceback: boom"], exit_code=1)))
    with pytest.raises(JobFailedError) as err:
        run()
    assert type(err.value) is JobFailedError and err.value.exit_code == 1
    assert "failed after" in err.value.summary and "evicted (EvictionByEvictionAPI)" in err.value.summary


# --------------------------------------------------------------------------------------- a job run for real
def preemptible_job(spec_path: str) -> int:
    """The stand-in job of the real-process scenarios: ``updates`` updates of ``update_s`` seconds each, resumed
    from the update its ``state`` file saved. On a SIGTERM (the real :class:`PreemptionNotice`, grace from
    ``MUGRPO_STOP_GRACE_S``) the update in flight runs on; then, if a save of ``save_s`` seconds fits in the grace
    left, it saves, prints ``preempted: saved update N (...)`` and exits 75."""
    spec = json.loads(Path(spec_path).read_text())
    notice = PreemptionNotice.from_env().install()
    state = Path(spec["state"])
    start = json.loads(state.read_text())["update"] if state.exists() else 0
    print(f"start at update {start}")
    for update in range(start + 1, spec["updates"] + 1):
        time.sleep(spec["update_s"])  # the update in flight
        print(f"update {update}")
        if notice.requested:
            fit = notice.fits(spec["save_s"])
            if not fit.fits:
                print(f"preempted: no checkpoint ({fit.describe()})")
                return PREEMPTED_EXIT_CODE
            time.sleep(spec["save_s"])
            tmp = state.with_suffix(".tmp")
            tmp.write_text(json.dumps({"update": update}))
            tmp.rename(state)
            print(f"preempted: saved update {update} ({fit.describe()})")
            return PREEMPTED_EXIT_CODE
    print("done")
    return 0


def real_job(tmp_path: Path, grace_s: str, **spec) -> JobRequest:
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"state": str(tmp_path / "state.json"), **spec}))
    return request(
        spec_url=str(spec_path),
        python=sys.executable,
        module="test_k8s_eviction",
        env={GRACE_ENV: grace_s, "PYTHONPATH": f"{TESTS_DIR}:{TESTS_DIR / 'integration'}"},
    )


def test_a_real_job_saves_its_update_in_flight_on_the_eviction_and_its_replacement_resumes(k8s, tmp_path):
    """The fake kubelet runs the job: on the eviction it gets SIGTERM, finishes the update in flight, saves it
    within the pod's terminationGracePeriodSeconds (5 s, from MUGRPO_STOP_GRACE_S) and exits 75; the replacement pod
    runs the same command, resumes from that update and completes the Job. No SIGKILL was needed."""
    fake = k8s(Plan(run=True, evict_after=3, replacement=Plan(run=True)))
    result, lines = run(real_job(tmp_path, "5", updates=5, update_s=0.3, save_s=0.1))
    assert result.exit_code == 0
    (job,) = fake.jobs.values()
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5
    evicted, replacement = pods_in_order(fake)
    assert fake.signals == [("SIGTERM", evicted)]
    assert lines.count(f"pod {evicted} evicted (EvictionByEvictionAPI); {REPLACED}") == 1
    (saved,) = [line for line in lines if line.startswith("preempted: saved update ")]
    n = int(saved.split()[3])  # the update in flight at the SIGTERM: the one after the third line, "update 2"
    assert n in (2, 3) and "s of the grace left" in saved
    job_lines = [line for line in lines if line.startswith(("start", "update", "done", "preempted"))]
    assert job_lines == [
        "start at update 0",
        *(f"update {i}" for i in range(1, n + 1)),
        saved,
        f"start at update {n}",
        *(f"update {i}" for i in range(n + 1, 6)),
        "done",
    ]
    assert [p[0] for p in fake.requests if p[1].endswith(f"/pods/{replacement}/log")]  # followed


def test_a_real_job_that_cannot_save_within_its_grace_is_killed_and_is_not_a_preemption(k8s, tmp_path):
    """An update in flight longer than the grace (1 s): the fake kubelet SIGKILLs the job once the pod's
    terminationGracePeriodSeconds has passed; exit code 137 (no replacement here) is a failure, not a preemption."""
    fake = k8s(Plan(run=True, evict_after=1))
    t0 = time.monotonic()
    with pytest.raises(JobFailedError) as err:
        run(real_job(tmp_path, "1", updates=1, update_s=30, save_s=0.1))
    assert time.monotonic() - t0 < 15
    (pod,) = fake.pods
    assert fake.signals == [("SIGTERM", pod), ("SIGKILL", pod)]
    assert type(err.value) is JobFailedError and err.value.exit_code == 137 and err.value.transient
    assert f"pod {pod} evicted (EvictionByEvictionAPI)" in err.value.summary
    assert not (tmp_path / "state.json").exists()


@pytest.mark.slow
def test_the_real_train_job_evicted_mid_stage_resumes_exactly_on_its_replacement(k8s, tmp_path, tiny_model_dir):
    """The real train job (tiny policy, 6 updates, a checkpoint every 2) in the fake kubelet, evicted while update 3
    runs (the job's pause point ``train/stage=0/update=3``): it saves update 3 within its 20 s grace and exits 75,
    the Job controller's replacement resumes after update 3 (nothing redone) and the Job completes; the published
    policy equals an uninterrupted run's, bitwise."""
    import torch
    from _tiny import job_env, policy_weights, start_job, train_spec, write_spec

    from bench.support.synthetic import commit_synthetic_stage
    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.common.faults import FAULT_ENV
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    train = {"updates_per_stage": 6, "checkpoint_every": 2, "warmup_updates": 1, "lr_schedule": "cosine"}
    stores = {}
    for name in ("straight", "evicted"):
        stores[name] = Store(str(tmp_path / name))
        commit_synthetic_stage(stores[name], "r1", tiny_model_dir, num_prompts=8, group_size=4, seed=11)
        write_spec(train_spec(tmp_path / name, "r1", train=train), tmp_path / f"{name}.spec.json")
    straight = start_job("train", tmp_path / "straight.spec.json", tmp_path / "straight.log")
    fake = k8s(Plan(run=True, evict_on=f"{FAULT_ENV} train/stage=0/update=3", replacement=Plan(run=True)))
    env = {**job_env(), GRACE_ENV: "20", FAULT_ENV: "train/stage=0/update=3:1"}
    env["PYTHONPATH"] = f"{TESTS_DIR.parent}:{env.get('PYTHONPATH', '')}"
    req = JobRequest(
        kind="train", spec_url=str(tmp_path / "evicted.spec.json"), timeout_s=600, python=sys.executable, env=env
    )
    result, lines = run(req)
    assert result.exit_code == 0, lines[-30:]
    evicted, _ = pods_in_order(fake)
    assert fake.signals == [("SIGTERM", evicted)]  # saved within the grace: no SIGKILL
    said = "preempted: train stage 0: stopped by SIGTERM after update 3 of 6; saved at update 3 of 6, 0 update(s)"
    assert any(line.startswith(said) for line in lines), lines[-30:]
    assert read_job_manifest(stores["evicted"], "r1", 0, "train").counts["resumed_from"] == 3
    assert straight.wait(timeout=300) == 0, (tmp_path / "straight.log").read_text()[-2000:]
    a = policy_weights(stores["straight"], RunLayout("r1").policy_dir(1))
    b = policy_weights(stores["evicted"], RunLayout("r1").policy_dir(1))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


if __name__ == "__main__":
    sys.exit(preemptible_job(sys.argv[1]))
