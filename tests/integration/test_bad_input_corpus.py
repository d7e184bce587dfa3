"""The bad-input corpus: every refusal of docs/reliability.md's "Refusals" table and every bad input a
hostile but fair user tried, replayed through the real ``mugrpo`` command line, one row per case.

For each case: the exit code, one block (no ``Traceback``, one ``Error:``), the file, row or key the block names,
and a byte-identical snapshot of the run root before and after (a refused start creates no folder at all). Cases
refused before Prefect starts need no Prefect server; they share one tiny model.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _tiny import REPO_ROOT, RUN, gsm8k_train, tiny_config, write_config


def snapshot(root: Path) -> dict[str, bytes] | None:
    """Every file under ``root`` with its bytes (folders included, as ``name/``); None when ``root`` is absent."""
    if not root.exists():
        return None
    out: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root)) + ("/" if p.is_dir() else "")] = b"" if p.is_dir() else p.read_bytes()
    return out


def mugrpo(args: list[str], fsize: int | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``mugrpo ARGS`` in a fresh process (no Prefect server: refusals come before it starts; a run that gets past
    them starts Prefect's temporary one); ``fsize``: a RLIMIT_FSIZE for it."""
    import resource

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "MUGRPO_RUN_SLOT": "off"}
    env.pop("PREFECT_API_URL", None)

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


def assert_one_block(out: subprocess.CompletedProcess, code: int, needles: list[str]) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == code, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert sum(line.startswith("Error:") for line in text.splitlines()) == 1, text[-3000:]
    if "temporary Prefect server" not in text:  # refused before Prefect started: the block is all there is
        assert len(text.strip().splitlines()) <= 12, text[-3000:]
    for needle in needles:
        assert needle in text, (needle, text[-3000:])
    return text


@dataclass
class Case:
    """``prepare(tmp, model_dir)`` writes the bad input and returns the command-line arguments; ``needles(tmp)`` are
    what the block must name."""

    prepare: Callable[[Path, Path], list[str]]
    code: int
    needles: Callable[[Path], list[str]]


def config_args(tmp: Path, model_dir: Path, text: str | None = None, **sections) -> list[str]:
    path = tmp / "run.yaml"
    if text is None:
        write_config(path, tiny_config(tmp / "runs", model_dir, **sections))
    else:
        path.write_text(text)
    return ["run", str(path)]


def duplicate_key(tmp: Path, model_dir: Path) -> list[str]:
    return config_args(
        tmp, model_dir, f"run: {{id: {RUN}, root: {tmp / 'runs'}}}\nmodel: {{source: {model_dir}}}\n"
        "train:\n  lr: 0.001\n  lr: 0.5\n"
    )  # fmt: skip


def duplicate_section(tmp: Path, model_dir: Path) -> list[str]:
    return config_args(
        tmp, model_dir, f"run:\n  id: {RUN}\n  root: {tmp / 'runs'}\nmodel: {{source: {model_dir}}}\n"
        "run:\n  id: other\n"
    )  # fmt: skip


def broken_model(change: Callable[[Path], None]) -> Callable[[Path, Path], list[str]]:
    """A copy of the tiny model folder broken by ``change(folder)``, as ``model.source``."""

    def prepare(tmp: Path, model_dir: Path) -> list[str]:
        folder = tmp / "model"
        shutil.copytree(model_dir, folder)
        change(folder)
        return config_args(tmp, model_dir, model={"source": str(folder)})

    return prepare


def truncate(path: Path, keep: int | None = None) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: keep if keep is not None else len(data) // 2])


def shard_index_missing_shard(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def config_json(edit: Callable[[dict], dict]) -> Callable[[Path], None]:
    """A change of ``broken_model``: the folder's config.json as ``edit`` returns it (its weights kept)."""

    def change(folder: Path) -> None:
        path = folder / "config.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))

    return change


def started_run(tmp: Path, model_dir: Path) -> Path:
    """A run killed as soon as run.json existed: run.json and the initial policy, no prompt plan yet (what the run
    flow writes first, :func:`mugrpo.orchestration.runs.init_run`). Its training file is a copy in ``tmp``."""
    from mugrpo.config import config_from_dict
    from mugrpo.orchestration.resume import check_resume, record_resume
    from mugrpo.orchestration.runs import ensure_initial_policy
    from mugrpo.storage.store import Store

    train = tmp / "train.jsonl"
    shutil.copy(gsm8k_train()["path"], train)
    cfg = config_from_dict(tiny_config(tmp / "runs", model_dir, data={"train": {**gsm8k_train(), "path": str(train)}}))
    store = Store(str(tmp / "runs"))
    record_resume(store, cfg, check_resume(store, cfg))
    ensure_initial_policy(cfg, store)
    return tmp / "runs" / RUN


def drift_before_the_first_plan(tmp: Path, model_dir: Path) -> list[str]:
    run = started_run(tmp, model_dir)
    train = tmp / "train.jsonl"
    st = train.stat()
    lines = train.read_bytes().splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    train.write_bytes(b"".join(lines))
    os.utime(train, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert train.stat().st_size == st.st_size
    return ["resume", str(run)]


def training_file(content: bytes, name: str = "train.jsonl") -> Callable[[Path, Path], list[str]]:
    def prepare(tmp: Path, model_dir: Path) -> list[str]:
        (tmp / name).write_bytes(content)
        return config_args(tmp, model_dir, data={"train": {**gsm8k_train(), "path": str(tmp / name)}})

    return prepare


def relative_run_id(command: str) -> Callable[[Path, Path], list[str]]:
    def prepare(tmp: Path, model_dir: Path) -> list[str]:
        return [command, "../ref", "--root", str(tmp / "runs")]

    return prepare


def resume_with(*overrides: str) -> Callable[[Path, Path], list[str]]:
    def prepare(tmp: Path, model_dir: Path) -> list[str]:
        return ["resume", str(started_run(tmp, model_dir)), *overrides]

    return prepare


def changed_weights(tmp: Path, model_dir: Path) -> list[str]:
    folder = tmp / "model"
    shutil.copytree(model_dir, folder)
    from mugrpo.config import config_from_dict
    from mugrpo.orchestration.resume import check_resume, record_resume
    from mugrpo.storage.store import Store

    cfg = config_from_dict(tiny_config(tmp / "runs", model_dir, model={"source": str(folder)}))
    store = Store(str(tmp / "runs"))
    record_resume(store, cfg, check_resume(store, cfg))
    config = folder / "generation_config.json"
    config.write_text(config.read_text().replace("}", ' , "note": 1}', 1))
    return ["resume", str(tmp / "runs" / RUN)]


def live_writer(tmp: Path, model_dir: Path) -> list[str]:
    """A started run whose lease a live foreign writer holds (another host: never taken over while live)."""
    import time

    run = started_run(tmp, model_dir)
    now = time.time()
    lease = {
        "owner": "preempted-pod-7:42", "token": "t" * 32, "host": "preempted-pod-7", "pid": 42, "pid_start": "0",
        "acquired_at": now,
        "heartbeat_at": now, "expires_at": now + 3600, "released": False,
    }  # fmt: skip
    (run / "_lease.json").write_text(json.dumps(lease))
    return ["resume", str(run)]


def corrupted_policy(tmp: Path, model_dir: Path) -> list[str]:
    run = started_run(tmp, model_dir)
    weights = run / "policies" / "stage=0" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    return ["resume", str(run)]


CASES: dict[str, Case] = {
    "unknown config key": Case(
        lambda tmp, m: [*config_args(tmp, m), "train.lrr=1e-5"], 2, lambda tmp: ["unknown key 'train.lrr'", "train.lr"]
    ),
    "config value out of range": Case(
        lambda tmp, m: [*config_args(tmp, m), "run.num_stages=0"], 2, lambda tmp: ["run.num_stages = 0"]
    ),
    "semantic key changed on resume": Case(
        resume_with("train.lr=0.5"), 2, lambda tmp: ["train.lr: 0.001 -> 0.5", "semantic"]
    ),
    "initial weights changed since the start": Case(
        changed_weights, 2, lambda tmp: ["model.weights", "recorded sha256", "current  sha256"]
    ),
    "missing training file": Case(
        lambda tmp, m: config_args(tmp, m, data={"train": {**gsm8k_train(), "path": str(tmp / "gone.jsonl")}}),
        2,
        lambda tmp: ["data.train.path", str(tmp / "gone.jsonl"), "an input is missing"],
    ),
    "bad training row": Case(
        training_file(b'{"question": "What is 2+2?", "answer": "#### 4"}\n{oops\n'),
        2,
        lambda tmp: [f"{tmp / 'train.jsonl'}:2: invalid JSON"],
    ),
    "stage larger than the training set": Case(
        lambda tmp, m: config_args(tmp, m, data={"train": gsm8k_train(limit=3)}),
        2,
        lambda tmp: ["asks for 4 prompts but the training set", "holds 3", "generation.prompts_per_stage"],
    ),
    "another live writer": Case(live_writer, 3, lambda tmp: ["is being written by", "preempted-pod-7:42"]),
    "corrupted committed file": Case(corrupted_policy, 3, lambda tmp: ["policies/stage=0/model.safetensors"]),
    "training set reordered before the first plan (same size, mtime set back)": Case(
        drift_before_the_first_plan, 2, lambda tmp: [str(tmp / "train.jsonl"), "recorded sha256", "current  sha256"]
    ),
    "empty training file": Case(
        training_file(b""), 2, lambda tmp: [str(tmp / "train.jsonl"), "holds no problems", "data.train"]
    ),
    "training file named .parquet that is not Parquet": Case(
        training_file(b'{"question": "1+1?", "answer": "#### 2"}\n', "train.parquet"),
        2,
        lambda tmp: [str(tmp / "train.parquet"), "is not a readable Parquet file"],
    ),
    **{
        f"`mugrpo {command}` of a run id with a slash": Case(relative_run_id(command), 2, lambda tmp: ["'../ref'"])
        for command in ("resume", "verify", "status")
    },
    "duplicate key in a section": Case(
        duplicate_key, 2, lambda tmp: [f"{tmp / 'run.yaml'}:5", "duplicate key 'train.lr'", "line 4"]
    ),
    "duplicate section": Case(duplicate_section, 2, lambda tmp: [f"{tmp / 'run.yaml'}:5", "duplicate key 'run'"]),
    "model folder without weights": Case(
        broken_model(lambda f: (f / "model.safetensors").unlink()),
        2,
        lambda tmp: ["model.source", "holds no weight file"],
    ),
    "model folder with truncated weights": Case(
        broken_model(lambda f: truncate(f / "model.safetensors")),
        2,
        lambda tmp: ["model.source", str(tmp / "model" / "model.safetensors"), "truncated"],
    ),
    "model folder with a cut header": Case(
        broken_model(lambda f: truncate(f / "model.safetensors", 100)),
        2,
        lambda tmp: ["model.source", str(tmp / "model" / "model.safetensors")],
    ),
    "sharded model folder missing a shard": Case(
        broken_model(shard_index_missing_shard),
        2,
        lambda tmp: ["model.source", "model-00002-of-00002.safetensors", "model.safetensors.index.json"],
    ),
    "model folder whose config.json builds a layer more than its weights hold": Case(
        broken_model(config_json(lambda c: {**c, "num_hidden_layers": c["num_hidden_layers"] + 1})),
        2,
        lambda tmp: [
            "model.source",
            str(tmp / "model" / "config.json"),
            "config.json builds 3 layers, the weights hold 2",
            "model.layers.2.* missing (9 tensors)",
        ],
    ),
    "model folder whose config.json has another hidden_size": Case(
        broken_model(config_json(lambda c: {**c, "hidden_size": 2 * c["hidden_size"]})),
        2,
        lambda tmp: [
            "model.source",
            str(tmp / "model" / "config.json"),
            "model.embed_tokens.weight: config.json builds [49152, 128], the weights hold [49152, 64]",
        ],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_block_and_changes_nothing(name, tmp_path, tiny_model_dir):
    case = CASES[name]
    args = case.prepare(tmp_path, tiny_model_dir)
    before = snapshot(tmp_path / "runs")
    out = mugrpo(args)
    assert_one_block(out, case.code, case.needles(tmp_path))
    assert snapshot(tmp_path / "runs") == before


# ------------------------------------------------------------------------------------------------ a full disk


@contextlib.contextmanager
def small_disk(folder: Path, free_bytes: int) -> Iterator[dict]:
    """``folder`` on a 2 MiB tmpfs with about ``free_bytes`` left (root, with mount allowed); else ``folder`` as is
    and a ``RLIMIT_FSIZE`` of ``free_bytes`` for the command (EFBIG takes the same write path as ENOSPC). Yields
    the keyword arguments for :func:`mugrpo`."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        yield {"fsize": free_bytes}
        return
    try:
        (folder / "filler").write_bytes(bytes(2 * 2**20 - free_bytes))
        yield {}
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def strays(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if ".tmp-" in p.name and not p.name.endswith(".tmp-lock")]


def test_a_full_disk_at_the_start_is_one_block_and_leaves_no_folder(tmp_path, tiny_model_dir):
    with small_disk(tmp_path / "disk", 512 * 1024) as extra:
        args = config_args(tmp_path, tiny_model_dir, run={"root": str(tmp_path / "disk" / "runs")})
        out = mugrpo(args, **extra)
        text = assert_one_block(out, 2, [f"cannot write to {tmp_path / 'disk' / 'runs' / RUN}"])
        assert "the disk is full" in text or "file size limit" in text
        assert not (tmp_path / "disk" / "runs").exists()


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_is_one_block_with_the_resume_command_and_no_stray_file(tmp_path, tiny_model_dir):
    """Room for the 1 MiB probe and run.json, not for the initial policy the run flow writes next (Prefect's
    temporary server starts). Needs the tmpfs: a file size limit would also stop Prefect's own database."""
    with small_disk(tmp_path / "disk", 1536 * 1024) as extra:
        if extra:
            pytest.skip("no tmpfs (mount not allowed): a RLIMIT_FSIZE would stop Prefect's database too")
        args = config_args(tmp_path, tiny_model_dir, run={"root": str(tmp_path / "disk" / "runs"), "num_stages": 1})
        out = mugrpo(args, **extra)
        run = tmp_path / "disk" / "runs" / RUN
        text = assert_one_block(out, 1, [f"could not write {run}/policies/stage=0/", f"mugrpo resume {run}"])
        assert "No space left on device" in text or "File too large" in text
        assert strays(tmp_path / "disk") == []


def test_a_sql_query_that_starts_with_a_comment_is_a_query_not_an_option(tmp_path, tiny_model_dir):
    """docs/sql.md's recipes start with ``--`` comments; pasted as the query they used to be parsed as an option."""
    run = started_run(tmp_path, tiny_model_dir)
    out = mugrpo(["sql", str(run), "-- a comment\nSELECT 41 + 1 AS answer", "--format", "csv"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["answer", "42"]
    out = mugrpo(["sql", str(run), "SELECT 1", "--no-such-option"])
    assert out.returncode == 2 and "--no-such-option" in out.stderr  # a real unknown option is still refused


# ---------------------------------------------------------------------------------------------- on the job path


def swap_first_lines_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    lines = path.read_bytes().splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    path.write_bytes(b"".join(lines))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.slow
def test_a_training_set_changed_mid_run_is_refused_by_the_job_as_one_block(tmp_path, tiny_model_dir):
    """Stage 0's generation job pauses as it writes its prompt plan (``MUGRPO_FAULT_PAUSE``); the training file is
    reordered then, keeping its size and mtime. Stage 1's generation job refuses its plan (exit 2, not retried) and
    the command prints that refusal once, exit code 2, with no Prefect traceback."""
    train = tmp_path / "train.jsonl"
    shutil.copy(gsm8k_train()["path"], train)
    args = config_args(tmp_path, tiny_model_dir, data={"train": {**gsm8k_train(), "path": str(train)}})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "MUGRPO_RUN_SLOT": "off"}
    env.pop("PREFECT_API_URL", None)
    env["MUGRPO_FAULT_PAUSE"] = "stage=0/generate.plan.json:4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mugrpo.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "MUGRPO_FAULT_PAUSE" in line:
            swap_first_lines_keeping_size_and_mtime(train)
            break
    seen.append(proc.stdout.read())
    out = subprocess.CompletedProcess(proc.args, proc.wait(timeout=600), "".join(seen), "")
    text = assert_one_block(out, 2, [str(train), "generate job refused", "recorded sha256"])
    assert text.count("current  sha256") == 1, text
    assert not (tmp_path / "runs" / RUN / "jobs" / "stage=1" / "generate.plan.json").exists()


def test_taking_the_run_lease_on_a_full_disk_names_the_file_and_leaves_no_temporary_file(tmp_path):
    from mugrpo.coordination.lease import RunLease
    from mugrpo.storage.store import StorageError, Store

    with small_disk(tmp_path / "disk", 0) as extra:
        if extra:
            pytest.skip("no tmpfs (mount not allowed)")
        (tmp_path / "disk" / "runs" / RUN).mkdir(parents=True)
        store = Store(str(tmp_path / "disk" / "runs"))
        with pytest.raises(StorageError, match=f"could not write {tmp_path / 'disk' / 'runs' / RUN}/_lease.json"):
            RunLease(store, RUN, ttl_s=60).acquire()
        assert strays(tmp_path / "disk") == []


def test_a_read_only_run_root_is_one_block_and_changes_nothing(tmp_path, tiny_model_dir):
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("no tmpfs (mount not allowed); permission denied is tests/integration/test_bad_inputs.py's")
    try:
        out = mugrpo(config_args(tmp_path, tiny_model_dir, run={"root": str(folder)}))
        assert_one_block(out, 2, [f"cannot write to {folder / RUN}", "read-only"])
        assert list(folder.iterdir()) == []
    finally:
        subprocess.run(["umount", str(folder)], check=True)
