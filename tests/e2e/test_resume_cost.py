"""A start's cost follows what it builds on: the real CLI, real flows on a real local Prefect server, real
jobs, on a local folder and on a real S3 API (moto).

- `mugrpo resume` of a finished run reads no policy or checkpoint bytes of earlier stages: every read of file bytes
  through the store is logged (``MUGRPO_READ_LOG``) and counted.
- what the resume reads is still hashed before use: a corrupted final policy is refused (one block, exit 3);
- an earlier stage's corruption is found by `mugrpo verify` and by `--quick` where the store's checksum shows it
  (a rewritten file); one that no store key shows (bytes changed in place, the mtime put back) by the full check only;
- a SIGKILL in the middle of the quick check, then a resume: the run completes bitwise equal to an uninterrupted one;
- on S3 a finished run's resume issues no GET of earlier stages' weights or optimizer state, and an earlier
  stage's replaced object is found by HEAD alone.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _s3 import moto_server  # noqa: F401  (fixture)
from _tiny import RUN, kill_tree, run_cli, run_env, start_run, tiny_config, write_config
from safetensors.torch import load_file

from mugrpo.storage.digests import read_log as reads

pytestmark = pytest.mark.slow

STAGES = 3
#: Jobs one after another, so that the run pauses between stages exactly where a test asks.
SEQUENTIAL = {"retries": 0, "overlap_checkpoint": False, "prestart_jobs": False}


def weight_reads(read: dict[str, int], below: int) -> list[str]:
    """The reads of weight or optimizer bytes (not markers, not JSON) of policies and checkpoints of stages < below."""
    bad = []
    for uri in read:
        name = uri.rsplit("/", 1)[-1]
        if name.endswith(".json") or name == "_COMPLETE":
            continue
        if "/checkpoints/" in uri or any(f"/policies/stage={k}/" in uri for k in range(below)):
            bad.append(uri)
    return bad


def flip_byte(path: Path, keep_mtime: bool = False) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:  # in place: same inode
        f.write(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir, prefect_api) -> Path:  # noqa: F811
    """A finished 3-stage tiny run, its jobs one after another (the reference of the kill test). Returns its root."""
    tmp = tmp_path_factory.mktemp("finished")
    root, log = tmp / "root", tmp / "run.log"
    cfg = write_config(
        tmp / "run.yaml", tiny_config(root, tiny_model_dir, run={"num_stages": STAGES}, orchestration=SEQUENTIAL)
    )
    proc = start_run(cfg, run_env(prefect_api, MUGRPO_RUN_SLOT="off"), log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]
    return root


@pytest.fixture
def copy(finished, tmp_path, prefect_api) -> tuple[Path, dict]:  # noqa: F811
    """A copy of the finished run (new inodes: the local hash cache knows none of its files) with its own cache,
    warmed by a full `mugrpo verify` as the run's own writes would have; (run folder, environment)."""
    root = tmp_path / "root"
    shutil.copytree(finished, root)
    env = run_env(prefect_api, MUGRPO_RUN_SLOT="off", MUGRPO_DIGEST_CACHE=str(tmp_path / "digests.sqlite"))
    out = run_cli(["verify", str(root / RUN)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    return root / RUN, env


def test_resume_of_a_finished_run_reads_no_weights_of_earlier_stages(copy, tmp_path):
    run, env = copy
    log = tmp_path / "reads.log"
    out = run_cli(["resume", str(run)], {**env, "MUGRPO_READ_LOG": str(log)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    read = reads(log)
    assert read, "nothing was read: the log is not written"
    assert weight_reads(read, below=STAGES) == []
    final = run / f"policies/stage={STAGES}"
    weights = sum(p.stat().st_size for p in final.iterdir() if p.name != "_COMPLETE")
    assert any(f"/policies/stage={STAGES}/model.safetensors" in u for u in read)  # what it builds on: hashed
    small = sum(n for u, n in read.items() if f"/policies/stage={STAGES}/" not in u)
    assert small < weights, f"read {small} bytes besides the final policy ({weights} bytes): {sorted(read)}"
    # One verification per start: the final policy was read once (the preflight's check, handed to the flow).
    assert read[str(final / "model.safetensors")] == (final / "model.safetensors").stat().st_size
    assert "re-hashed" in out.stdout + out.stderr


def test_what_the_resume_reads_is_hashed_and_refused_before_use(copy):
    run, env = copy
    flip_byte(run / f"policies/stage={STAGES}/model.safetensors", keep_mtime=True)  # no store key shows it
    out = run_cli(["resume", str(run)], env)
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert f"policies/stage={STAGES}/model.safetensors" in text and "recover:" in text
    assert "Traceback" not in text


def test_an_earlier_stage_corruption_is_found_by_quick_where_the_store_can_show_it(copy):
    run, env = copy
    # Rewritten (a new mtime): the quick check finds the cache key changed, hashes the file and names it.
    flip_byte(run / "policies/stage=1/model.safetensors")
    quick = run_cli(["verify", "--quick", str(run)], env)
    assert quick.returncode == 1 and "policies/stage=1/model.safetensors" in quick.stderr, quick.stdout + quick.stderr
    resumed = run_cli(["resume", str(run)], env)
    assert resumed.returncode == 3 and "policies/stage=1/model.safetensors" in resumed.stdout + resumed.stderr
    flip_byte(run / "policies/stage=1/model.safetensors")  # restored
    assert run_cli(["verify", str(run)], env).returncode == 0
    # Changed in place with the mtime put back: no key the store keeps shows it; only the full check reads it.
    flip_byte(run / "rollouts/stage=0/shard=00000.parquet", keep_mtime=True)
    quick = run_cli(["verify", "--quick", str(run)], env)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert "by the store's checksum" in quick.stdout
    full = run_cli(["verify", str(run)], env)
    assert full.returncode == 1 and "rollouts/stage=0/shard=00000.parquet" in full.stderr, full.stdout + full.stderr


def test_sigkill_during_the_quick_check_then_resume_is_exact(finished, tmp_path, tiny_model_dir, prefect_api):  # noqa: F811
    """Stopped between stage 0 and 1 (killed while it writes stage 1's first job spec), then a resume with a cold
    hash cache is SIGKILLed while its check hashes stage 0's rollouts; the next resume completes, and the final
    weights are bitwise those of the uninterrupted run."""
    root, log = tmp_path / "root", tmp_path / "run.log"
    cfg = write_config(
        tmp_path / "run.yaml", tiny_config(root, tiny_model_dir, run={"num_stages": STAGES}, orchestration=SEQUENTIAL)
    )
    env = run_env(prefect_api, MUGRPO_RUN_SLOT="off")
    run = root / RUN

    def run_until(extra: dict, marker: str) -> None:
        proc = start_run(cfg, {**env, **extra}, log)
        deadline = time.monotonic() + 900
        while f"MUGRPO_FAULT_PAUSE {marker}" not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"ended (code {proc.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.05)
        kill_tree(proc)

    run_until({"MUGRPO_FAULT_PAUSE": "jobs/stage=1/generate.spec.json:120"}, f"{RUN}/jobs/stage=1/generate.spec.json")
    assert (run / "stages/stage=0.json").exists() and not (run / "jobs/stage=1/generate.manifest.json").exists()
    shard = "rollouts/stage=0/shard=00000.parquet"
    cold = {"MUGRPO_DIGEST_CACHE": str(tmp_path / "cold.sqlite"), "MUGRPO_FAULT_PAUSE": f"{shard}:120"}
    run_until(cold, f"{RUN}/{shard}")
    assert not (run / "jobs/stage=1/generate.manifest.json").exists()  # killed in the check: nothing began
    proc = start_run(cfg, env, log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]
    final = f"{RUN}/policies/stage={STAGES}/model.safetensors"
    reference, weights = load_file(str(finished / final)), load_file(str(root / final))
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert tensor.equal(weights[name]), f"{name} differs from the uninterrupted run"
    assert run_cli(["verify", str(run)], env).returncode == 0


def test_s3_resume_of_a_finished_run_gets_no_weights_of_earlier_stages(
    tmp_path,
    tiny_model_dir,
    moto_server,
    prefect_api,  # noqa: F811
):
    import s3fs

    bucket = f"cost-{uuid.uuid4().hex[:8]}"
    direct = s3fs.S3FileSystem(endpoint_url=moto_server, skip_instance_cache=True)
    direct.mkdir(bucket)
    root = f"s3://{bucket}/runs"
    cfg = tiny_config(root, tiny_model_dir, run={"storage_options": {"endpoint_url": moto_server}})
    config = write_config(tmp_path / "s3.yaml", cfg)
    # No local hash cache: what the quick check knows on S3 comes from the store (HEAD) alone.
    env = run_env(prefect_api, MUGRPO_RUN_SLOT="off", MUGRPO_DIGEST_CACHE="off")
    out = run_cli(["run", str(config)], env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    url, options = f"{root}/{RUN}", ["--storage-option", f"endpoint_url={moto_server}"]
    log = tmp_path / "reads.log"
    out = run_cli(["resume", url, *options], {**env, "MUGRPO_READ_LOG": str(log)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    read = reads(log)
    assert any("/policies/stage=2/model.safetensors" in u for u in read)
    assert weight_reads(read, below=2) == [], sorted(read)
    # An earlier stage's object replaced by other bytes of the same size, by a writer that sends S3 checksums: the
    # HEAD's SHA-256 differs from the manifest's, found without a GET.
    key = f"runs/{RUN}/policies/stage=1/model.safetensors"
    data = bytearray(direct.cat_file(f"{bucket}/{key}"))
    data[len(data) // 2] ^= 0xFF
    direct.call_s3("put_object", Bucket=bucket, Key=key, Body=bytes(data), ChecksumAlgorithm="SHA256")
    log.unlink()
    quick = run_cli(["verify", "--quick", url, *options], {**env, "MUGRPO_READ_LOG": str(log)})
    assert quick.returncode == 1 and "policies/stage=1/model.safetensors" in quick.stderr, quick.stdout + quick.stderr
    assert "SHA-256 checksum" in quick.stderr
    assert not any("/policies/stage=1/model" in u for u in reads(log))  # HEAD alone
    # Replaced by a writer that sends no checksum: the store cannot vouch for it, so the check reads it: found.
    direct.pipe_file(f"{bucket}/{key}", bytes(data))
    quick = run_cli(["verify", "--quick", url, *options], env)
    assert quick.returncode == 1 and "policies/stage=1/model.safetensors" in quick.stderr, quick.stdout + quick.stderr


def test_bench_resume_run_times_the_three_arms_on_a_real_run(copy):
    """bench/resume_run.py on the finished run: each arm's bytes read, quick's only the final stage's."""
    import re
    import subprocess
    import sys

    from _tiny import REPO_ROOT

    run, env = copy
    out = subprocess.run(
        [sys.executable, "bench/resume_run.py", str(run), "--rounds", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    read = {m[0]: float(m[1]) for m in re.findall(r"(quick|full|before)\s+[\d.]+ s\s+([\d.]+) MiB read", out.stdout)}
    assert set(read) == {"quick", "full", "before"}, out.stdout
    final = sum(p.stat().st_size for p in (run / f"policies/stage={STAGES}").iterdir()) / 2**20
    assert read["quick"] < final + 1 < read["full"] < read["before"]
    assert "ratio quick/before" in out.stdout
