"""Resume cost with history: what a start's check of the committed files costs as a run grows, before and after the
quick check (:mod:`mugrpo.commits.verify`).

    python bench/resume_scale.py                       # local folder and moto S3, the default grid (~13 min here)
    python bench/resume_scale.py --quick               # CI mode: a few MB, 1 and 4 stages, about a minute
    python bench/resume_scale.py --stores local --sizes-gb 0.05 0.25 --stages 1 4 16 --json out.json
    python bench/resume_scale.py --from-json out.json  # the summary of a saved result, again

Default grid: n in {1, 4, 16} committed stages; locally P in {0.05, 0.25, 1} GB without the 16 x 1 GB cell (a 49 GB
run: cells over --max-run-gb are dropped, and said so), at most ~16 GB on disk at a time; on moto S3 P in {5, 20} MB
without 16 x 20 MB (moto serves tens of MB/s).

A synthetic run of ``n`` committed stages with a policy of ``P`` bytes is written through the real
:class:`mugrpo.storage.store.Store` (``upload_dir`` and the manifest writers), so S3's SHA-256 checksums, the ETags
``_COMPLETE`` markers record for multipart objects and the local hash cache are recorded as the real writers record
them. Its layout is the trainer's: ``policies/stage=0`` (a ``model.safetensors`` of P random bytes and small config
and tokenizer files); per stage k a rollout shard (the real schema, bench/sql_scale.py's generator) and the prompt
plan with the ``generate`` job manifest; a ``train_steps`` part, the published policy ``policies/stage=k+1`` and the
final checkpoint ``checkpoints/stage=k/step=000008`` (``optimizer.pt`` of 2P bytes: fp32 AdamW moments are twice the
fp32 weights; ``rng.safetensors``, ``trainer_state.json`` and a ``policy.ref.json`` referencing the published policy,
"weights written once") with the ``train`` job manifest (which lists the published policy's files, as the trainer's
does), then the stage manifest; after the last stage the final evaluation's manifest. The table parts and the eval
file are random bytes of their size class (only hashed here, never parsed). Older stages keep their moments
(``train.keep_optimizer_state=auto`` keeps all below 4 GiB per checkpoint).

The same folder is measured as two runs:

- **finished**: ``run.num_stages = n``: every stage committed; a resume builds on the final policy;
- **mid-run**: ``run.num_stages = n + 1``: stage n is open (its policy committed, no stage manifest); a resume
  re-hashes the open stage and the checkpoint of stage n-1 it resumes from (2P of moments), by design.

What is timed is a start's whole preflight (:func:`mugrpo.orchestration.preflight.preflight`: every check a
``mugrpo run`` / ``mugrpo resume`` makes before Prefect starts, with a real run.json recorded by
:func:`mugrpo.orchestration.resume.record_resume`), and within it the committed files' check
(:func:`mugrpo.commits.verify.refuse_corrupted`, timed by a wrapper), after one untimed start (imports). Arms,
alternated within each round (quick, full, before; then before, full, quick), the median over ``--rounds`` rounds for
small runs, one round for runs over ``--repeat-below-gb`` (local) or ``--s3-repeat-below-gb``:

- **quick** (after): ``orchestration.verify_on_resume=quick``, what a start does now;
- **full**: ``verify_on_resume=full`` once: the old code path with its duplicate check removed (the best honest
  configuration of the old code);
- **before**: ``full``, then the same full check again, as the flow re-checked under the lease before this change:
  what a start did.

Bytes read are the store's own counter (:attr:`Store.bytes_read`, every byte of file content read) and the reads are
attributed per file through ``MUGRPO_READ_LOG``; HEADs / stats are :attr:`Store.heads`. On a local store each arm
starts with the run's pages dropped from the page cache (``posix_fadvise(DONTNEED)`` on every file), so hashing reads
the disk as a start on a fresh process after a long run does. S3 is moto in server mode on 127.0.0.1 in its own
process (its objects in temporary files), with smaller sizes: moto serves tens of MB/s, not S3's rates; the requests
it answered (HEAD / GET / LIST) are counted from its access log.

The cold local cache: the run copied to a fresh machine has no hash cache (``MUGRPO_DIGEST_CACHE`` pointing at a new
empty file): its first quick start hashes every file once, the next start is warm again; both are reported (finished
runs).

Targets (printed PASS / MISS): quick-mode verification flat in the number of committed stages within 10% for the same
P (t(16)/t(1) <= 1.1), and quick-mode bytes read <= the files the next work reads (finished: the final stage; mid-run:
the open stage and the checkpoint it resumes from) plus every manifest, marker and JSON file. The 7B projection counts
the weight and moment files each arm read (fitted linearly in n over the measured cells) and prices them at a 14 GB
bf16 policy, 56 GB of fp32 AdamW moments per checkpoint and 200 MB/s (and, apart, the quick start's small requests
fitted on moto, at an assumed 20 ms each). Nothing is asserted; folders are freed after each cell.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATA = REPO.parent / "shared" / "data"
RUN_ID = "history"
ARMS = ("quick", "full", "before")
REQUESTS = ("HEAD", "GET", "LIST")
VARIANTS = ("finished", "mid-run")
WEIGHTS, MOMENTS = "model.safetensors", "optimizer.pt"
STEPS = 8  # stage updates: the final checkpoint is step=000008
GB, MB = 10**9, 10**6
FLAT = 1.1  # target: t(n_max) / t(1) of the quick check
#: The 7B projection: a bf16 policy, fp32 AdamW moments per checkpoint, 4 stages, an S3 read rate.
P7B, M7B, STAGES_7B, S3_RATE = 14 * GB, 56 * GB, 4, 200 * MB
#: An assumed latency of one small S3 request (HEAD, a GET of a manifest, a LIST) in the projection; not measured.
S3_REQUEST_S = 0.02


# ----------------------------------------------------------------------------------------------------- the run
def _random_file(path: Path, size: int, seed: int) -> None:
    """``size`` random bytes (numpy's PCG64: os.urandom is ~10x slower here)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, 64 * 2**20)
            f.write(rng.bytes(n))
            left -= n


def _stamp(path: Path, k: int) -> None:
    """Make the staged file's bytes differ per stage (its first 8 bytes), without rewriting it."""
    with open(path, "r+b") as f:
        f.write(k.to_bytes(8, "little"))


def _small(n: int, seed: int) -> bytes:
    import numpy as np

    return np.random.default_rng(seed).bytes(n)


def stage_sources(work: Path, policy_bytes: int) -> tuple[Path, Path]:
    """Local folders uploaded for every stage: the HF policy dir and the checkpoint dir (stamped per stage)."""
    policy, ckpt = work / "src-policy", work / "src-checkpoint"
    _random_file(policy / WEIGHTS, policy_bytes, 1)
    (policy / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 576}))
    (policy / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (policy / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8192}))
    (policy / "tokenizer.json").write_bytes(_small(2_000_000, 2))  # SmolLM2's tokenizer.json: ~2 MB
    _random_file(ckpt / MOMENTS, 2 * policy_bytes, 3)
    (ckpt / "rng.safetensors").write_bytes(_small(20_000, 4))
    return policy, ckpt


def write_history(store: Any, n: int, policy_bytes: int, work: Path) -> float:
    """Commit ``n`` stages and the final evaluation of run :data:`RUN_ID` (module docstring); returns seconds."""
    from bench.sql_scale import ShardGenerator
    from mugrpo.commits.manifest import new_manifest, write_job_manifest, write_manifest
    from mugrpo.commits.policies import committed_policy_ref
    from mugrpo.commits.tables import write_table
    from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout
    from schemas import FileRecord, JobManifest

    started = time.perf_counter()
    layout = RunLayout(RUN_ID)
    policy, ckpt = stage_sources(work, policy_bytes)
    now = datetime.datetime.now(datetime.UTC)

    def small_file(rel: str, data: bytes) -> FileRecord:
        return FileRecord(path=layout.rel(rel), sha256=store.write_bytes(rel, data), bytes=len(data))

    def folder_records(rel: str, sums: dict[str, str], src: Path) -> list[FileRecord]:
        return [
            FileRecord(path=layout.rel(f"{rel}/{name}"), sha256=digest, bytes=(src / name).stat().st_size)
            for name, digest in sums.items()
        ]

    store.upload_dir(policy, layout.policy_dir(0), meta={"stage": 0})
    gen = ShardGenerator(RUN_ID, group_size=8, prompt_tokens=100, response_tokens=300, seed=0)
    for k in range(n):
        plan = small_file(layout.prompt_plan(k), json.dumps({"stage": k, "prompts": list(range(16))}).encode())
        shard_rel = layout.rollout_shard(k, 0)
        shard = write_table(store, shard_rel, gen.shard(k, 128), "rollouts", run_rel=layout.rel(shard_rel))
        generate = JobManifest(run_id=RUN_ID, stage=k, job="generate", created_at=now, files=[shard])
        write_job_manifest(store, generate)
        steps = small_file(layout.train_steps_part(k, STEPS), _small(30_000, 10 + k))
        _stamp(policy / WEIGHTS, k + 1)
        published = layout.policy_dir(k + 1)
        sums = store.upload_dir(policy, published, meta={"stage": k + 1})
        (ckpt / POLICY_REF_FILE).write_bytes(committed_policy_ref(store, published).to_bytes())
        (ckpt / "trainer_state.json").write_text(json.dumps({"stage": k, "stage_update": STEPS}))
        _stamp(ckpt / MOMENTS, k + 1)
        store.upload_dir(ckpt, layout.checkpoint_dir(k, STEPS))
        train_files = [steps, *folder_records(published, sums, policy)]
        counts = {"updates": STEPS, "policy_version": (k + 1) * STEPS}
        train = JobManifest(run_id=RUN_ID, stage=k, job="train", created_at=now, files=train_files, counts=counts)
        write_job_manifest(store, train)
        write_manifest(store, new_manifest(RUN_ID, k, [*generate.files, *train.files, plan]))
    evals = small_file(layout.eval_file(n, "gsm8k"), _small(60_000, 99))
    write_job_manifest(store, JobManifest(run_id=RUN_ID, stage=n, job="eval", created_at=now, files=[evals]))
    return time.perf_counter() - started


# -------------------------------------------------------------------------------------------------- the start
def run_config(root: str, options: dict, num_stages: int, mode: str, model_dir: Path) -> Any:
    """The run's config: a tiny run (its inputs are fingerprinted by preflight, a constant cost) over the history."""
    from mugrpo.config import config_from_dict

    return config_from_dict(
        {
            "run": {"id": RUN_ID, "root": root, "storage_options": options, "seed": 0, "num_stages": num_stages},
            "model": {"source": str(model_dir), "max_context": 512, "dtype": "float32"},
            "data": {
                "train": {
                    "name": "gsm8k",
                    "path": str(DATA / "gsm8k" / "train.jsonl"),
                    "answer_kind": "gsm8k",
                    "limit": 40,
                }
            },
            "generation": {"prompts_per_stage": 2, "shard_size": 2, "sampling": {"max_new_tokens": 8, "n": 8}},
            "train": {
                "updates_per_stage": STEPS,
                "rollouts_per_update": 2,
                "micro_batch_size": 2,
                "checkpoint_every": STEPS,
                "mixed_precision": "no",
            },
            "eval": {
                "every_stage": False,
                "benchmarks": [
                    {
                        "dataset": {
                            "name": "gsm8k",
                            "path": str(DATA / "gsm8k" / "test.jsonl"),
                            "answer_kind": "gsm8k",
                        },
                        "num_prompts": 2,
                        "max_new_tokens": 8,
                    }
                ],
            },
            "orchestration": {"verify_on_resume": mode},
        },
        source="bench/resume_scale.py",
    )


def record_run(store: Any, cfg: Any) -> None:
    """(Re)write run.json as a new run with ``cfg`` records it (num_stages is semantic: a variant is a new doc)."""
    from mugrpo.orchestration.resume import check_resume, record_resume

    store.delete(cfg.layout.run_json)
    record_resume(store, cfg, check_resume(store, cfg))


@contextlib.contextmanager
def timed_verification(times: list[float]) -> Iterator[None]:
    """Time every :func:`mugrpo.commits.verify.refuse_corrupted` call (preflight imports it at call time)."""
    from mugrpo.commits import verify

    real = verify.refuse_corrupted

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - t0)

    verify.refuse_corrupted = timed
    try:
        yield
    finally:
        verify.refuse_corrupted = real


def drop_page_cache(folder: Path) -> None:
    """Evict the folder's files from the page cache (a start on a fresh process after a long run reads the disk)."""
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def classify(reads: dict[str, int], n: int) -> dict[str, int]:
    """Bytes read by kind: weights / moments of the latest stages (the policy of stage n; the checkpoint of stage n-1)
    and of earlier ones, and everything else (manifests, markers, shards, small files)."""
    out = {"latest_weights": 0, "earlier_weights": 0, "latest_moments": 0, "earlier_moments": 0, "other": 0}
    for uri, nbytes in reads.items():
        name = uri.rsplit("/", 1)[-1]
        stage = next((int(part.split("=")[1]) for part in uri.split("/")[:-1] if part.startswith("stage=")), -1)
        if name == WEIGHTS:
            out["latest_weights" if stage == n else "earlier_weights"] += nbytes
        elif name == MOMENTS:
            out["latest_moments" if stage == n - 1 else "earlier_moments"] += nbytes
        else:
            out["other"] += nbytes
    return out


def one_start(cfgs: dict[str, Any], arm: str, log: Path, n: int, server: MotoServer | None = None) -> dict[str, Any]:
    """One start of ``arm`` (module docstring): seconds of the preflight and of its files' check, bytes, HEADs (and
    the S3 requests the server served, by kind)."""
    from mugrpo.commits import verify
    from mugrpo.orchestration.preflight import preflight
    from mugrpo.storage.digests import READ_LOG_ENV

    cfg = cfgs["quick" if arm == "quick" else "full"]
    log.unlink(missing_ok=True)
    os.environ[READ_LOG_ENV] = str(log)
    times: list[float] = []
    served = server.requests() if server is not None else None
    try:
        t0 = time.perf_counter()
        with timed_verification(times):
            cleared = preflight(cfg)
            if arm == "before":  # the flow's own check under the lease, as a start made it before this change
                verify.refuse_corrupted(cleared.store, cfg.run.id, cfg.run.num_stages, cfg.layout, quick=False)
        start_s = time.perf_counter() - t0
    finally:
        os.environ.pop(READ_LOG_ENV, None)
    from mugrpo.storage.digests import read_log

    reads = read_log(log)
    if server is not None:
        after = server.requests()
        served = {k: after[k] - served[k] for k in after}
    return {
        "start_s": start_s,
        "verify_s": sum(times),
        "bytes_read": cleared.store.bytes_read,
        "logged_bytes": sum(reads.values()),
        "heads": cleared.store.heads,
        "by_kind": classify(reads, n),
        "requests": served,
    }


def listing(store: Any) -> dict[str, int]:
    """{run-relative path: bytes} of every file of the run."""
    root = store.full(RUN_ID)
    found = store.fs.find(root, detail=True)
    return {path[len(root) + 1 :]: int(info["size"]) for path, info in found.items()}


def next_work_bound(files: dict[str, int], n: int, variant: str) -> int:
    """Bytes of the files the next work reads (finished: the final stage, i.e. stage n's policy, jobs and evals;
    mid-run: the open stage n and the checkpoint of stage n-1 it resumes from) plus every JSON file and marker."""
    latest = (f"policies/stage={n}/", f"jobs/stage={n}/", f"evals/stage={n}/", f"rollouts/stage={n}/")
    if variant == "mid-run":
        latest += (f"checkpoints/stage={n - 1}/",)
    return sum(
        size
        for path, size in files.items()
        if path.startswith(latest) or path.endswith(".json") or path.rsplit("/", 1)[-1] == "_COMPLETE"
    )


# ------------------------------------------------------------------------------------------------------ stores
class MotoServer:
    """moto's S3 server (``ThreadedMotoServer``, as tests/_s3.py) in a child process on 127.0.0.1: its request
    handling does not share this process's GIL; its objects spill to temporary files under ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        code = (
            "import sys\nfrom moto.server import ThreadedMotoServer\n"
            "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\ns.start()\n"
            "print('%s:%s' % s.get_host_and_port(), flush=True)\nsys.stdin.read()\ns.stop()\n"
        )
        tmp.mkdir(parents=True, exist_ok=True)
        self.log = tmp / "requests.log"  # one line per request (werkzeug's access log)
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**os.environ, "TMPDIR": str(tmp)},
            )
        self.endpoint = f"http://{self.proc.stdout.readline().strip()}"

    def requests(self) -> dict[str, int]:
        """Requests served so far by kind: HEAD, GET (object), LIST, WRITE (PUT / POST / DELETE)."""
        time.sleep(0.05)  # the access log line follows the response
        out = dict.fromkeys((*REQUESTS, "WRITE"), 0)
        for line in self.log.read_text().splitlines():
            if '"HEAD ' in line:
                out["HEAD"] += 1
            elif '"GET ' in line:
                out["LIST" if "list-type=" in line or "?prefix=" in line else "GET"] += 1
            elif any(f'"{verb} ' in line for verb in ("PUT", "POST", "DELETE")):
                out["WRITE"] += 1
        return out

    def bucket(self) -> tuple[str, dict]:
        import s3fs

        options = {"endpoint_url": self.endpoint}
        name = f"bench-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(**options).mkdir(name)
        return f"s3://{name}/runs", options

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------------------------------------------- a cell
def measure_cell(kind: str, n: int, policy_bytes: int, rounds: int, work: Path, model_dir: Path) -> dict:
    """Write the history, measure both variants' arms (and the cold local cache), free everything."""
    from mugrpo.storage.digests import DIGEST_CACHE_ENV
    from mugrpo.storage.store import Store

    cell_dir = work / f"{kind}-n{n}-p{policy_bytes}"
    cell_dir.mkdir(parents=True)
    server = MotoServer(cell_dir / "moto-tmp") if kind == "s3" else None
    cache_before = os.environ.get(DIGEST_CACHE_ENV)
    os.environ[DIGEST_CACHE_ENV] = str(cell_dir / "digests.sqlite")  # this machine's hash cache, filled by writes
    try:
        if server is not None:
            root, options = server.bucket()
        else:
            root, options = str(cell_dir / "root"), {}
        store = Store(root, options)
        write_s = write_history(store, n, policy_bytes, cell_dir / "staging")
        shutil.rmtree(cell_dir / "staging")
        files = listing(store)
        run_dir = Path(store.full(RUN_ID)) if store.is_local else None
        out: dict[str, Any] = {
            "store": kind,
            "stages": n,
            "policy_bytes": policy_bytes,
            "run_bytes": sum(files.values()),
            "files": len(files),
            "write_s": round(write_s, 2),
            "rounds": rounds,
            "variants": {},
        }
        log = cell_dir / "reads.log"
        for variant in VARIANTS:
            num_stages = n if variant == "finished" else n + 1
            cfgs = {m: run_config(root, options, num_stages, m, model_dir) for m in ("quick", "full")}
            record_run(store, cfgs["quick"])
            one_start(cfgs, "quick", log, n)  # untimed: the first start of a process imports what preflight uses
            arms: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for r in range(rounds):
                for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
                    if run_dir is not None:
                        drop_page_cache(run_dir)
                    arms[arm].append(one_start(cfgs, arm, log, n, server))
            result = {"bound_bytes": next_work_bound(files, n, variant), "arms": {}}
            for arm, starts in arms.items():
                result["arms"][arm] = {
                    "verify_s": statistics.median(s["verify_s"] for s in starts),
                    "start_s": statistics.median(s["start_s"] for s in starts),
                    "verify_s_all": [round(s["verify_s"], 4) for s in starts],
                    **{k: starts[-1][k] for k in ("bytes_read", "logged_bytes", "heads", "by_kind", "requests")},
                }
            if store.is_local and variant == "finished":  # the run copied to a fresh machine: an empty hash cache
                os.environ[DIGEST_CACHE_ENV] = str(cell_dir / f"cold-{variant}.sqlite")
                cold = []
                for _ in range(2):
                    drop_page_cache(run_dir)
                    cold.append(one_start(cfgs, "quick", log, n))
                os.environ[DIGEST_CACHE_ENV] = str(cell_dir / "digests.sqlite")
                result["cold_cache"] = {"first": cold[0], "next": cold[1]}
            out["variants"][variant] = result
            print(line_of(out, variant), flush=True)
        return out
    finally:
        if cache_before is None:
            os.environ.pop(DIGEST_CACHE_ENV, None)
        else:
            os.environ[DIGEST_CACHE_ENV] = cache_before
        if server is not None:
            server.stop()
        shutil.rmtree(cell_dir, ignore_errors=True)


def line_of(cell: dict, variant: str) -> str:
    v = cell["variants"][variant]
    a = v["arms"]
    return (
        f"{cell['store']:<5} {variant:<8} n={cell['stages']:<2} P={cell['policy_bytes'] / GB:.3f} GB: "
        + ", ".join(f"{arm} {a[arm]['verify_s']:.3f} s / {a[arm]['bytes_read'] / MB:,.1f} MB" for arm in ARMS)
        + f"; before/quick {a['before']['verify_s'] / max(a['quick']['verify_s'], 1e-9):.1f}x"
    )


# ----------------------------------------------------------------------------------------------------- summary
def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def growth(cells: list[dict]) -> list[dict]:
    """Per store, variant and P: the quick check's seconds and bytes against the number of committed stages."""
    out = []
    keys = sorted({(c["store"], c["policy_bytes"]) for c in cells})
    for store, p in keys:
        series = sorted((c for c in cells if c["store"] == store and c["policy_bytes"] == p), key=lambda c: c["stages"])
        if len(series) < 2:
            continue
        ns = [c["stages"] for c in series]
        for variant in VARIANTS:
            quick = [c["variants"][variant]["arms"]["quick"] for c in series]
            ts, bs, starts = (
                [q["verify_s"] for q in quick],
                [q["bytes_read"] for q in quick],
                [q["start_s"] for q in quick],
            )
            requests = [sum(q["requests"][k] for k in REQUESTS) for q in quick if q["requests"] is not None]
            out.append(
                {
                    "store": store,
                    "policy_bytes": p,
                    "variant": variant,
                    "stages": ns,
                    "verify_s": ts,
                    "s_per_stage": fit(ns, ts)[0],
                    "bytes_per_stage": fit(ns, bs)[0],
                    "t_ratio": ts[-1] / ts[0],
                    "start_ratio": starts[-1] / starts[0],
                    "b_ratio": bs[-1] / bs[0],
                    "flat": ts[-1] / ts[0] <= FLAT,
                    "requests": requests or None,
                    "requests_per_stage": fit(ns, requests)[0] if requests else None,
                }
            )
    return out


def projection(cells: list[dict]) -> dict:
    """Bytes and seconds at 7B (module docstring) from the weight and moment files each arm read, fitted in n."""
    local = [c for c in cells if c["store"] == "local"] or cells
    p = max({c["policy_bytes"] for c in local}, key=lambda q: (sum(c["policy_bytes"] == q for c in local), -q))
    series = sorted((c for c in local if c["policy_bytes"] == p), key=lambda c: c["stages"])
    out: dict[str, Any] = {"from_policy_bytes": p, "from_stages": [c["stages"] for c in series], "rows": []}
    s3 = [c for c in cells if c["store"] == "s3"]
    s3_series = []
    if s3:  # the quick start's requests (HEAD / GET / LIST) at the smallest P: metadata, each at a request's latency
        q = min({c["policy_bytes"] for c in s3}, key=lambda q: (-sum(c["policy_bytes"] == q for c in s3), q))
        s3_series = sorted((c for c in s3 if c["policy_bytes"] == q), key=lambda c: c["stages"])
        out.update(requests_from_policy_bytes=q, requests_from_stages=[c["stages"] for c in s3_series])
    for variant, n in (("finished", STAGES_7B), ("mid-run", STAGES_7B - 1)):
        for arm in ARMS:
            kinds = [c["variants"][variant]["arms"][arm]["by_kind"] for c in series]
            ns = [c["stages"] for c in series]
            weights = [(k["latest_weights"] + k["earlier_weights"]) / p for k in kinds]
            moments = [(k["latest_moments"] + k["earlier_moments"]) / (2 * p) for k in kinds]
            w, m = (max(0.0, sum(f) if len(ns) < 2 else f[0] * n + f[1]) for f in (fit(ns, weights), fit(ns, moments)))
            nbytes = w * P7B + m * M7B
            passes = 2 if arm == "before" else 1  # each full pass reads the one checkpoint auto keeps moments of
            pruned = w * P7B + min(m, passes) * M7B
            requests = None
            if arm == "quick" and len(s3_series) >= 2:
                counts = [sum(c["variants"][variant]["arms"][arm]["requests"][k] for k in REQUESTS) for c in s3_series]
                slope, intercept = fit([c["stages"] for c in s3_series], counts)
                requests = slope * n + intercept
            out["rows"].append(
                {
                    "requests": requests,
                    "variant": variant,
                    "stages": STAGES_7B,
                    "committed": n,
                    "arm": arm,
                    "policy_files": round(w, 2),
                    "moment_files": round(m, 2),
                    "bytes": nbytes,
                    "seconds": nbytes / S3_RATE,
                    "bytes_auto_retention": pruned,
                    "seconds_auto_retention": pruned / S3_RATE,
                }
            )
    return out


def print_summary(result: dict) -> None:
    cells = result["cells"]
    m = result["machine"]
    print(
        f"\nmachine: {m['cpus']} CPUs, Python {m['python']}, torch {m['torch']}, moto {m['moto']}, s3fs {m['s3fs']}; "
        f"{m['date']}; load average {m['load_average_start'][0]:.2f} at the start"
    )
    print(f"measured: {result['measured']}")
    for store in sorted({c["store"] for c in cells}):
        print(f"\n### {store}\n")
        what = "HEADs" if store == "local" else "requests HEAD/GET/LIST (whole start)"
        print(
            f"| run | stages n | P (GB) | run (GB) | quick: check s / start s / MB read / {what} "
            "| full: check s / MB read | before (full x2): check s / MB read | before / quick | full / quick "
            "| quick MB <= bound MB |"
        )
        print("|---|---:|---:|---:|---|---|---|---:|---:|---|")
        for c in sorted((c for c in cells if c["store"] == store), key=lambda c: (c["policy_bytes"], c["stages"])):
            for variant in VARIANTS:
                v = c["variants"][variant]
                q, f, b = (v["arms"][a] for a in ARMS)
                ok = q["bytes_read"] <= v["bound_bytes"]
                heads = q["heads"] if q["requests"] is None else "/".join(str(q["requests"][k]) for k in REQUESTS)
                print(
                    f"| {variant} | {c['stages']} | {c['policy_bytes'] / GB:.3f} | {c['run_bytes'] / GB:.2f} | "
                    f"{q['verify_s']:.3f} / {q['start_s']:.2f} / {q['bytes_read'] / MB:,.1f} / {heads} | "
                    f"{f['verify_s']:.3f} / {f['bytes_read'] / MB:,.1f} | "
                    f"{b['verify_s']:.3f} / {b['bytes_read'] / MB:,.1f} | "
                    f"{b['verify_s'] / q['verify_s']:.1f}x | {f['verify_s'] / q['verify_s']:.1f}x | "
                    f"{q['bytes_read'] / MB:,.1f} <= {v['bound_bytes'] / MB:,.1f}: {'PASS' if ok else 'MISS'} |"
                )
        cold = [c for c in cells if c["store"] == store and "cold_cache" in c["variants"]["finished"]]
        if cold:
            print("\ncold local hash cache (the run on a fresh machine; first quick start, then the next):\n")
            print(
                "| run | stages n | P (GB) | first: check s / MB read | next: check s / MB read | warm quick: check s |"
            )
            print("|---|---:|---:|---|---|---:|")
            for c in sorted(cold, key=lambda c: (c["policy_bytes"], c["stages"])):
                for variant in [v for v in VARIANTS if "cold_cache" in c["variants"][v]]:
                    v = c["variants"][variant]
                    first, nxt = v["cold_cache"]["first"], v["cold_cache"]["next"]
                    print(
                        f"| {variant} | {c['stages']} | {c['policy_bytes'] / GB:.3f} | {first['verify_s']:.3f} / "
                        f"{first['bytes_read'] / MB:,.1f} | {nxt['verify_s']:.3f} / {nxt['bytes_read'] / MB:,.1f} | "
                        f"{v['arms']['quick']['verify_s']:.3f} |"
                    )
    print("\ngrowth of the quick check with the number of committed stages (least squares over n):\n")
    print(
        "| store | run | P (GB) | n | check s | s per added stage | MB per added stage | S3 requests per added stage "
        "| t(max n)/t(1) | start t(max n)/t(1) | target <= 1.1 |"
    )
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---|")
    for g in result["growth"]:
        print(
            f"| {g['store']} | {g['variant']} | {g['policy_bytes'] / GB:.3f} | {','.join(map(str, g['stages']))} | "
            f"{', '.join(f'{t:.3f}' for t in g['verify_s'])} | {g['s_per_stage'] * 1000:.1f} ms | "
            f"{g['bytes_per_stage'] / MB:.3f} | "
            f"{'-' if g.get('requests_per_stage') is None else format(g['requests_per_stage'], '.1f')} | "
            f"{g['t_ratio']:.2f} | {g['start_ratio']:.2f} | "
            f"{'PASS' if g['flat'] else 'MISS'} |"
        )
    for c in cells:
        for variant in VARIANTS:
            q = c["variants"][variant]["arms"]["quick"]
            print(
                f"ratio before/quick {c['store']} {variant} n={c['stages']} P={c['policy_bytes'] / GB:.3f} GB: "
                f"{c['variants'][variant]['arms']['before']['verify_s'] / q['verify_s']:.1f}x seconds, "
                f"{c['variants'][variant]['arms']['before']['bytes_read'] / max(q['bytes_read'], 1):.1f}x bytes"
            )
    t = result["targets"]
    print(
        f"\ntarget flat (quick check t(max n)/t(1) <= {FLAT}): {t['flat']['pass']} of {t['flat']['of']} series PASS"
        f" -> {'PASS' if t['flat']['pass'] == t['flat']['of'] else 'MISS'}"
    )
    print(
        f"target bytes (quick <= next work + manifests): {t['bytes']['pass']} of {t['bytes']['of']} cells PASS -> "
        f"{'PASS' if t['bytes']['pass'] == t['bytes']['of'] else 'MISS'}"
    )
    proj = result["projection"]
    print(
        f"\n7B projection (policy {P7B / GB:.0f} GB bf16, AdamW moments {M7B / GB:.0f} GB per checkpoint, "
        f"{STAGES_7B} stages, {S3_RATE / MB:.0f} MB/s; file counts fitted over n = "
        f"{','.join(map(str, proj['from_stages']))} at P = {proj['from_policy_bytes'] / GB:.3f} GB):\n"
    )
    print(
        "| resume | arm | policy files read | moment files read | GB read | time at 200 MB/s | GB / time with older "
        "moments pruned (keep_optimizer_state=auto at 7B) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in proj["rows"]:
        what = "finished run" if row["variant"] == "finished" else f"mid-run (stage {row['committed']} open)"
        print(
            f"| {what} | {row['arm']} | {row['policy_files']:g} | {row['moment_files']:g} | "
            f"{row['bytes'] / GB:,.0f} | {row['seconds'] / 60:,.1f} min | {row['bytes_auto_retention'] / GB:,.0f} / "
            f"{row['seconds_auto_retention'] / 60:,.1f} min |"
        )
    quick = [r for r in proj["rows"] if r["requests"] is not None]
    if quick:
        print(
            f"\nplus the quick start's small requests (HEAD / GET / LIST of the whole start, fitted over n = "
            f"{','.join(map(str, proj['requests_from_stages']))} on moto at P = "
            f"{proj['requests_from_policy_bytes'] / GB:.3f} GB), at an assumed {S3_REQUEST_S * 1000:.0f} ms each "
            "(one after another): "
            + "; ".join(
                f"{r['variant']} {r['requests']:.0f} requests ~ {r['requests'] * S3_REQUEST_S:.0f} s" for r in quick
            )
        )


def summarize(result: dict) -> dict:
    """Fill in the growth fits, the targets and the projection of a measured ``result``, print it; returns it."""
    cells = result["cells"]
    result["growth"] = growth(cells)
    bounded = [c["variants"][v] for c in cells for v in VARIANTS]
    result["targets"] = {
        "flat": {"pass": sum(g["flat"] for g in result["growth"]), "of": len(result["growth"])},
        "bytes": {
            "pass": sum(v["arms"]["quick"]["bytes_read"] <= v["bound_bytes"] for v in bounded),
            "of": len(bounded),
        },
    }
    result["projection"] = projection(cells)
    print_summary(result)
    m = result["machine"]
    print(f"\nwall: {result['wall_s']:.0f} s; load average at the end {m['load_average_end'][0]:.2f}")
    return result


# -------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", nargs="+", choices=("local", "s3"), default=["local", "s3"])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 4, 16], help="committed stages n")
    ap.add_argument("--sizes-gb", type=float, nargs="+", default=[0.05, 0.25, 1.0], help="policy sizes P, local")
    ap.add_argument("--s3-sizes-gb", type=float, nargs="+", default=[0.005, 0.02], help="policy sizes P, moto S3")
    ap.add_argument("--max-run-gb", type=float, default=14.0, help="local cells whose run exceeds this are dropped")
    ap.add_argument("--s3-max-run-gb", type=float, default=0.3, help="S3 cells whose run exceeds this are dropped")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three arms, alternated (small cells)")
    ap.add_argument("--repeat-below-gb", type=float, default=1.0, help="larger local runs get one round")
    ap.add_argument("--s3-repeat-below-gb", type=float, default=0.1, help="larger S3 runs get one round")
    ap.add_argument(
        "--quick", action="store_true", help="CI mode: P of 2 MB (local), 4 MB (S3), n in {1, 4}, two rounds"
    )
    ap.add_argument("--work", type=Path, help="parent of the bench's folders (default: the temp dir)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--from-json", type=Path, help="print the summary of a result written by --json (no measuring)")
    args = ap.parse_args(argv)
    if args.from_json:
        result = summarize(json.loads(args.from_json.read_text()))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=str))
        return result
    if args.quick:
        args.stages, args.sizes_gb, args.s3_sizes_gb, args.rounds = [1, 4], [0.002], [0.004], 2

    from mugrpo.policy.models import bench_model_dir

    grid, dropped = [], []
    for kind in args.stores:
        for p in args.sizes_gb if kind == "local" else args.s3_sizes_gb:
            for n in args.stages:
                run_gb = p * (3 * n + 1)
                local = kind == "local"
                rounds = args.rounds if run_gb <= (args.repeat_below_gb if local else args.s3_repeat_below_gb) else 1
                fits = run_gb <= (args.max_run_gb if local else args.s3_max_run_gb)
                (grid if fits else dropped).append((kind, n, int(p * GB), rounds))
    for kind, n, p, _ in dropped:
        print(f"dropped: {kind} n={n} P={p / GB:.3f} GB (its run: {p * (3 * n + 1) / GB:.2f} GB, over the limit)")
    started, load_start = time.perf_counter(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="mugrpo-resume-scale-", dir=args.work))
    try:
        model_dir = bench_model_dir("tiny", work / "models")
        cells = [measure_cell(kind, n, p, rounds, work, model_dir) for kind, n, p, rounds in grid]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import moto
    import s3fs
    import torch

    result: dict[str, Any] = {
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "moto": moto.__version__,
            "s3fs": s3fs.__version__,
            "load_average_start": load_start,
            "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "load_average_end": os.getloadavg(),
        },
        "measured": "the whole preflight(cfg) of a start (every check mugrpo run / resume makes before Prefect "
        "starts, run.json included) and, within it, refuse_corrupted (the committed files' check; 'check s'); "
        "before = full, then the flow's second full check",
        "dropped": [{"store": k, "stages": n, "policy_bytes": p} for k, n, p, _ in dropped],
        "cells": cells,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    summarize(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main()
