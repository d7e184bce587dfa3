"""A scripted fake of the Kubernetes API: an HTTP server on 127.0.0.1 that the real ``kubernetes_asyncio`` client
talks to through a kubeconfig (no cluster exists here).

It serves the calls the kubernetes launcher makes (batch/v1 Jobs: create, read, list, delete; pods: list, follow
a log with ``timestamps``/``sinceTime``; events: list by ``involvedObject.name``) from in-memory objects, records
every request, injects scripted HTTP errors, and plays a :class:`Plan` per Job in place of the Job controller and
the kubelet: run a container that prints lines and exits, keep a pod pending with a waiting reason, or create no
pod at all (admission refused it).
"""

from __future__ import annotations

import json
import re
import threading
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
    """

    lines: list[str] = field(default_factory=list)
    exit_code: int = 0
    drop_after: int | None = None
    waiting: tuple[str, str] | None = None
    no_pod: bool = False
    events: list[tuple[str, str]] = field(default_factory=list)
    fail_reason: str = "BackoffLimitExceeded"
    hang: bool = False


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
            plan = self.plans[job]
            drop = plan.drop_after if n_stream == 1 else None
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
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
        with self.lock:  # every line was streamed: the container exits
            if "running" in self.pods[pod]["status"]["containerStatuses"][0]["state"]:
                self._finish(job, plan.exit_code, plan.fail_reason)
        h.wfile.write(b"0\r\n\r\n")

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
            self._pod_count += 1
            pod = f"{name}-{self._pod_count:05d}"[:63]
            involved = pod
            state = (
                {"waiting": {"reason": plan.waiting[0], "message": plan.waiting[1]}}
                if plan.waiting
                else {"running": {"startedAt": rfc3339nano(T0)}}
            )
            self.pods[pod] = {
                "metadata": {"name": pod, "labels": {"job-name": name}, "creationTimestamp": rfc3339nano(T0)},
                "status": {
                    "phase": "Pending" if plan.waiting else "Running",
                    "containerStatuses": [{"name": "job", "state": state}],
                },
            }
            self.logs[pod] = [(T0 + timedelta(milliseconds=300 * i), text) for i, text in enumerate(plan.lines)]
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

    def _finish(self, name: str, code: int, reason: str = "BackoffLimitExceeded") -> None:
        for pod in self.pods.values():
            if pod["metadata"]["labels"]["job-name"] == name:
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
