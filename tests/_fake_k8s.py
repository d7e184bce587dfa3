"""A scripted fake of the Kubernetes API: an HTTP server on 127.0.0.1 that the real ``kubernetes_asyncio`` client
talks to through a kubeconfig (no cluster exists here).

It serves the calls the kubernetes launcher makes (batch/v1 Jobs: create, read, list, delete; pods: list, follow
a log with ``timestamps``/``sinceTime``; events: list by ``involvedObject.name``) from in-memory objects, records
every request, injects scripted HTTP errors, and plays a :class:`Plan` per Job in place of the Job controller and
the kubelet: run a container that prints lines and exits, keep a pod pending with a waiting reason, create no
pod at all (admission refused it), or evict a running pod (``Plan.evict_after``) and replace it as the Job
controller does under the Job's ``podFailurePolicy`` (``Plan.replacement``).

The container is scripted (its lines and exit code come from the plan) unless ``Plan.run``: then the fake kubelet
runs the container's command for real, as a local subprocess (the manifest's command less its init prefix, in the
manifest's plain env on top of this process's), streams its output as the pod's log, and on an eviction sends it
SIGTERM, then SIGKILL after the pod's ``terminationGracePeriodSeconds``, as a kubelet does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

T0 = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)


def rfc3339nano(t: datetime) -> str:
    """Like Go's time.RFC3339Nano (the kubelet's log timestamps): trailing zeros of the fraction trimmed."""
    frac = f"{t.microsecond:06d}000".rstrip("0")
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def parse_time(s: str) -> datetime:
    base, _, frac = s.rstrip("Z").partition(".")
    return datetime.fromisoformat(base).replace(tzinfo=UTC) + timedelta(
        microseconds=int((frac or "0")[:6].ljust(6, "0"))
    )


@dataclass
class Plan:
    """What the fake cluster does with one Job.

    Attributes:
        lines: log lines of its pod's container (0.3 s apart: several share a second, as on a real kubelet).
        exit_code: the container's exit code once every line was streamed (0 = Job Complete, else Failed).
        drop_after: the first log stream breaks (chunked body cut off) after this many lines; the container runs on.
        waiting: ``(reason, message)``: the pod stays Pending with this container waiting reason.
        no_pod: the Job controller cannot create a pod (the Job's events say why).
        events: Warning events ``(reason, message)`` on the pod (or on the Job when ``no_pod``).
        fail_reason: reason of the Job's Failed condition when ``exit_code`` != 0 (``DeadlineExceeded``: the
            cluster killed it at ``activeDeadlineSeconds``).
        hang: after its lines the container runs on silently (the stream stays open until the fake stops).
        evict_after: the pod is evicted (Eviction API: deleted with its grace period) once the container has printed
            this many lines: it gets the condition ``DisruptionTarget`` (reason ``eviction_reason``) and, scripted,
            prints the rest of ``lines`` in its grace and exits ``evicted_exit_code`` (with ``run``: the process
            gets SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds``; its own exit code, 128 + signal when
            killed). The pod ends Failed, and the Job controller, whose ``podFailurePolicy`` ignores the failure of
            a disrupted pod, creates a replacement pod (a new name, the same ``job-name`` label) that plays
            ``replacement``; the Job ends with the replacement's result. A container that exits 0 in its grace
            completes the Job.
        evicted_exit_code: exit code of the scripted container on its SIGTERM (75: it saved its work).
        eviction_reason: reason of the ``DisruptionTarget`` condition.
        replacement: what the replacement pod of an evicted one does; None: no replacement, the Job fails with
            the evicted pod's exit code (a cluster whose Job controller does not honour ``podFailurePolicy``).
        run: run the container's command as a local subprocess instead of playing ``lines`` / ``exit_code``.
        evict_on: with ``run``, evict the pod at the first output line containing this text (instead of a count).
    """

    lines: list[str] = field(default_factory=list)
    exit_code: int = 0
    drop_after: int | None = None
    waiting: tuple[str, str] | None = None
    no_pod: bool = False
    events: list[tuple[str, str]] = field(default_factory=list)
    fail_reason: str = "BackoffLimitExceeded"
    hang: bool = False
    evict_after: int | None = None
    evicted_exit_code: int = 75
    eviction_reason: str = "EvictionByEvictionAPI"
    replacement: Plan | None = None
    run: bool = False
    evict_on: str | None = None


@dataclass
class Fault:
    """Answer the next ``times`` requests matching ``method`` and ``path`` (regex) with HTTP ``status``."""

    method: str
    path: str
    status: int
    times: int = 1


class FakeKubernetes:
    """The fake API server; use as a context manager, then point ``KUBECONFIG`` at :meth:`write_kubeconfig`."""

    def __init__(self, plan: Plan | None = None):
        self.plan = plan or Plan()
        self.plans: dict[str, Plan] = {}
        #: What each pod plays (an evicted pod's replacement plays its plan's ``replacement``).
        self.pod_plans: dict[str, Plan] = {}
        #: Containers run for real (``Plan.run``): pod -> process.
        self.procs: dict[str, subprocess.Popen] = {}
        #: What the fake kubelet did to real containers, in order: ``("SIGTERM" | "SIGKILL", pod)``.
        self.signals: list[tuple[str, str]] = []
        self._kill_timers: dict[str, threading.Timer] = {}
        self._mono0 = time.monotonic()
        self.jobs: dict[str, dict] = {}
        self.services: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.logs: dict[str, list[tuple[datetime, str]]] = {}
        self.events: list[dict] = []
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, dict]] = []
        #: Reads of a deleted Job that still find it (foreground deletion waits for its pods).
        self.reads_until_gone = 2
        self._gone_countdown: dict[str, int] = {}
        self._streams: dict[str, int] = {}
        self._pod_count = 0
        self.stopped = threading.Event()
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                fake.handle(self, "GET")

            def do_POST(self):
                fake.handle(self, "POST")

            def do_DELETE(self):
                fake.handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    # ------------------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> FakeKubernetes:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        with self.lock:
            for timer in self._kill_timers.values():
                timer.cancel()
            procs = list(self.procs.values())
        for proc in procs:  # containers run for real end with the cluster
            if proc.poll() is None:
                _killpg(proc, signal.SIGKILL)
            proc.wait()
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path, namespace: str = "mugrpo") -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    # ----------------------------------------------------------------------------------------------- queries
    def calls(self, method: str, pattern: str) -> list[tuple[str, str, dict]]:
        """Recorded requests of ``method`` whose path matches ``pattern`` (regex, searched)."""
        return [r for r in self.requests if r[0] == method and re.search(pattern, r[1])]

    def add_job(self, manifest: dict, plan: Plan, *, state: str = "running") -> None:
        """A Job that exists before the launcher runs (a previous flow run's): ``running`` (its pod runs
        ``plan.lines``), ``failed`` or ``succeeded``."""
        with self.lock:
            self._create(json.loads(json.dumps(manifest)), plan)
            name = manifest["metadata"]["name"]
            if state != "running":
                self._finish(name, 0 if state == "succeeded" else 1)

    # ----------------------------------------------------------------------------------------------- HTTP
    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = None
        if method in ("POST", "DELETE") and int(h.headers.get("Content-Length") or 0):
            body = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
        with self.lock:
            self.requests.append((method, url.path, query))
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and re.search(fault.path, url.path):
                    fault.times -= 1
                    return self._send(h, fault.status, _status(fault.status, "injected fault"))
        m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?", url.path)
        if m:
            return self._jobs(h, method, m.group(2), query, body)
        if re.fullmatch(r"/api/v1/namespaces/([^/]+)/services", url.path) and method == "POST":
            with self.lock:
                if body["metadata"]["name"] in self.services:
                    return self._send(h, 409, _status(409, "AlreadyExists"))
                self.services[body["metadata"]["name"]] = body
            return self._send(h, 201, body)
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", url.path)
        if m and method == "GET":
            return self._log(h, m.group(2), query)
        if re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path) and method == "GET":
            name = query.get("labelSelector", "").removeprefix("job-name=")
            with self.lock:
                items = [p for p in self.pods.values() if p["metadata"]["labels"]["job-name"] == name]
            return self._send(h, 200, {"kind": "PodList", "items": items})
        if re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", url.path) and method == "GET":
            name = query.get("fieldSelector", "").removeprefix("involvedObject.name=")
            with self.lock:
                items = [e for e in self.events if e["involvedObject"]["name"] == name]
            return self._send(h, 200, {"kind": "EventList", "items": items})
        return self._send(h, 404, _status(404, f"no route {url.path}"))

    def _jobs(self, h, method: str, name: str | None, query: dict, body: dict | None) -> None:
        with self.lock:
            if method == "POST":
                if body["metadata"]["name"] in self.jobs:
                    return self._send(h, 409, _status(409, "AlreadyExists"))
                self._create(body, self.plan)
                return self._send(h, 201, self.jobs[body["metadata"]["name"]])
            if method == "GET" and name is None:
                key, _, value = query.get("labelSelector", "").partition("=")
                items = [j for j in self.jobs.values() if j["metadata"]["labels"].get(key) == value]
                return self._send(h, 200, {"kind": "JobList", "items": items})
            if name not in self.jobs:
                return self._send(h, 404, _status(404, f'jobs.batch "{name}" not found'))
            if method == "DELETE":
                self.jobs[name]["metadata"]["deletionTimestamp"] = rfc3339nano(T0)
                self._gone_countdown.setdefault(name, self.reads_until_gone)
                return self._send(h, 200, self.jobs[name])
            job = self.jobs[name]
            if name in self._gone_countdown:  # foreground deletion: gone once its pods are
                self._gone_countdown[name] -= 1
                if self._gone_countdown[name] < 0:
                    del self.jobs[name], self._gone_countdown[name]
                    for pod in [p for p, v in self.pods.items() if v["metadata"]["labels"]["job-name"] == name]:
                        del self.pods[pod]
                        if pod in self.procs and self.procs[pod].poll() is None:
                            _killpg(self.procs[pod], signal.SIGKILL)
                    return self._send(h, 404, _status(404, f'jobs.batch "{name}" not found'))
            return self._send(h, 200, job)

    def _log(self, h, pod: str, query: dict) -> None:
        assert query.get("follow") == "true" and query.get("timestamps") == "true", query
        with self.lock:
            if pod not in self.pods:
                return self._send(h, 404, _status(404, f'pods "{pod}" not found'))
            since = parse_time(query["sinceTime"]) if "sinceTime" in query else None
            lines = [(t, s) for t, s in self.logs[pod] if since is None or t >= since]
            n_stream = self._streams[pod] = self._streams.get(pod, 0) + 1
            job = self.pods[pod]["metadata"]["labels"]["job-name"]
            plan = self.pod_plans[pod]
            drop = plan.drop_after if n_stream == 1 else None
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        if plan.run:
            return self._follow_process(h, pod, since)
        for i, (t, text) in enumerate(lines):
            if drop is not None and i == drop:  # cut the stream: no terminating chunk, connection closed
                h.wfile.flush()
                h.close_connection = True
                return
            data = f"{rfc3339nano(t)} {text}\n".encode()
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        if plan.hang:
            h.wfile.flush()
            self.stopped.wait(30)
            return
        with self.lock:  # every line was streamed: the container exits (evicted: the rest was its grace)
            if self._running(pod):
                if plan.evict_after is not None:
                    self._evict(pod)
                    self._exited(pod, plan.evicted_exit_code)
                else:
                    self._finish(job, plan.exit_code, plan.fail_reason)
        h.wfile.write(b"0\r\n\r\n")

    def _follow_process(self, h, pod: str, since: datetime | None) -> None:
        """Stream a real container's log as it grows, until the container has exited and every line was sent."""
        sent = 0
        try:
            while True:
                with self.lock:
                    while sent == len(self.logs[pod]) and self._running(pod) and not self.stopped.is_set():
                        self._changed.wait(0.2)
                    batch, sent = self.logs[pod][sent:], len(self.logs[pod])
                    ended = not self._running(pod) or self.stopped.is_set()
                for t, text in batch:
                    if since is None or t >= since:
                        data = f"{rfc3339nano(t)} {text}\n".encode()
                        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                h.wfile.flush()
                if ended:
                    h.wfile.write(b"0\r\n\r\n")
                    return
        except OSError:  # the launcher closed the stream
            h.close_connection = True

    # --------------------------------------------------------------------------------------- controller/kubelet
    def _create(self, job: dict, plan: Plan) -> None:
        name = job["metadata"]["name"]
        job["metadata"]["creationTimestamp"] = rfc3339nano(T0)
        job["metadata"]["uid"] = f"uid-{name}"
        job["status"] = {"active": 1}
        self.jobs[name] = job
        self.plans[name] = plan
        involved = name
        completions = job["spec"].get("completions", 1) if job["spec"].get("completionMode") == "Indexed" else 1
        for _ in range(0 if plan.no_pod else completions):  # an Indexed Job: one pod per completion index
            involved = self._start_pod(name, plan, T0)
        for reason, message in plan.events:
            self.events.append(
                {
                    "type": "Warning",
                    "reason": reason,
                    "message": message,
                    "involvedObject": {"name": involved},
                    "lastTimestamp": rfc3339nano(T0),
                }
            )

    def _start_pod(self, name: str, plan: Plan, created: datetime) -> str:
        """Create a pod of Job ``name`` playing ``plan`` (its container starts at once, unless ``plan.waiting``)."""
        self._pod_count += 1
        pod = f"{name}-{self._pod_count:05d}"[:63]
        state = (
            {"waiting": {"reason": plan.waiting[0], "message": plan.waiting[1]}}
            if plan.waiting
            else {"running": {"startedAt": rfc3339nano(created)}}
        )
        self.pods[pod] = {
            "metadata": {"name": pod, "labels": {"job-name": name}, "creationTimestamp": rfc3339nano(created)},
            "status": {
                "phase": "Pending" if plan.waiting else "Running",
                "containerStatuses": [{"name": "job", "state": state}],
            },
        }
        self.pod_plans[pod] = plan
        self.logs[pod] = [(created + timedelta(milliseconds=300 * i), text) for i, text in enumerate(plan.lines)]
        if plan.run:
            self.logs[pod] = []
            self._run_container(pod, self.jobs[name])
        return pod

    def _run_container(self, pod: str, job: dict) -> None:
        """Start the pod's container as a local process (its own session: signals reach its process group, as tini
        ``-g`` forwards them) and a thread that appends its output lines to the pod's log."""
        container = job["spec"]["template"]["spec"]["containers"][0]
        command = list(container["command"])
        if Path(command[0]).name == "tini" and "--" in command:  # the init prefix: the fake kubelet is the init
            command = command[command.index("--") + 1 :]
        env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}}
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[pod] = proc
        threading.Thread(target=self._read_container, args=(pod, proc), daemon=True).start()

    def _read_container(self, pod: str, proc: subprocess.Popen) -> None:
        plan = self.pod_plans[pod]
        for n, raw in enumerate(proc.stdout, start=1):
            with self.lock:
                self.logs[pod].append((self._now(), raw.decode("utf-8", "replace").rstrip("\r\n")))
                if n == plan.evict_after or (plan.evict_on is not None and plan.evict_on in self.logs[pod][-1][1]):
                    self._evict(pod)
                self._changed.notify_all()
        code = proc.wait()
        with self.lock:
            timer = self._kill_timers.pop(pod, None)
            if timer is not None:
                timer.cancel()
            if self._running(pod):
                self._exited(pod, 128 - code if code < 0 else code)  # killed by a signal: 128 + signal
            self._changed.notify_all()

    def _now(self) -> datetime:
        """The fake cluster's clock: T0 plus the seconds since the fake started (a real container's log stamps)."""
        return T0 + timedelta(seconds=time.monotonic() - self._mono0)

    def _running(self, pod: str) -> bool:
        """The pod's container runs (False once it exited or the pod is gone)."""
        return pod in self.pods and "running" in self.pods[pod]["status"]["containerStatuses"][0]["state"]

    def _evict(self, pod: str) -> None:
        """The Eviction API deletes the pod with its grace period: the condition DisruptionTarget, a deletion
        timestamp, and (a real container) SIGTERM now, SIGKILL once ``terminationGracePeriodSeconds`` passed."""
        meta, status = self.pods[pod]["metadata"], self.pods[pod]["status"]
        if any(c["type"] == "DisruptionTarget" for c in status.get("conditions") or []):
            return
        reason = self.pod_plans[pod].eviction_reason
        status.setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "Eviction API: evicting"}
        )
        meta["deletionTimestamp"] = rfc3339nano(self._now())
        proc = self.procs.get(pod)
        if proc is not None and proc.poll() is None:
            job = self.jobs[meta["labels"]["job-name"]]
            grace = job["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
            self.signals.append(("SIGTERM", pod))
            _killpg(proc, signal.SIGTERM)
            timer = self._kill_timers[pod] = threading.Timer(grace, self._grace_over, (pod,))
            timer.daemon = True
            timer.start()

    def _grace_over(self, pod: str) -> None:
        with self.lock:
            proc = self.procs[pod]
            if proc.poll() is None:
                self.signals.append(("SIGKILL", pod))
                _killpg(proc, signal.SIGKILL)

    def _exited(self, pod: str, code: int) -> None:
        """The pod's container exited with ``code``: an evicted pod is replaced (the Job's podFailurePolicy ignores
        its failure) unless it succeeded or its plan has no replacement; any other pod ends the Job."""
        job = self.pods[pod]["metadata"]["labels"]["job-name"]
        plan = self.pod_plans[pod]
        status = self.pods[pod]["status"]
        evicted = any(c["type"] == "DisruptionTarget" for c in status.get("conditions") or [])
        if not evicted or code == 0 or plan.replacement is None:
            return self._finish(job, code, plan.fail_reason)
        status["phase"] = "Failed"
        status["containerStatuses"][0]["state"] = {"terminated": {"exitCode": code, "reason": "Error"}}
        newest = max(parse_time(p["metadata"]["creationTimestamp"]) for p in self.pods.values())
        self._start_pod(job, plan.replacement, newest + timedelta(seconds=1))  # podReplacementPolicy: Failed

    def _finish(self, name: str, code: int, reason: str = "BackoffLimitExceeded") -> None:
        for pod in self.pods.values():
            state = pod["status"]["containerStatuses"][0]["state"]
            if pod["metadata"]["labels"]["job-name"] == name and "terminated" not in state:
                pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
                pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": code}}
        cond = (
            {"type": "Complete", "status": "True"}
            if code == 0
            else {
                "type": "Failed",
                "status": "True",
                "reason": reason,
                "message": f"Job failed: {reason}",
            }
        )
        self.jobs[name]["status"] = {"conditions": [cond], "succeeded" if code == 0 else "failed": 1}

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # exited meanwhile
        pass


def _status(code: int, message: str) -> dict:
    reason = {404: "NotFound", 409: "AlreadyExists", 503: "ServiceUnavailable"}.get(code, "Error")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
