"""A whole 2-stage run on S3: `mugrpo run` with `run.root: s3://...` on the moto server behind the
fault-injecting proxy (tests/_faults.py), real Prefect flows on a real local Prefect server, real job subprocesses.

1. The server stops in the middle of stage 0's checkpoint upload (model files sent, optimizer state not): the train
   job fails past its retry budget naming the object; the run stops.
2. The server is back; `mugrpo resume` runs until the server stops again in the middle of stage 1's second shard
   write: the generate job fails naming the shard.
3. The server is back; `mugrpo resume` completes. Nothing is lost or duplicated: every (stage, prompt_id,
   sample_idx) once, one train_steps row per update, `mugrpo verify` intact.

Secrets: every process runs with distinctive fake AWS credentials and a Prefect API key in its environment; no
output of the run holds either value: the objects in the bucket (Parquet, run.json, manifests, job specs, the HTML
report), the CLI output (logs), and the Prefect flow runs' parameters, logs and artifacts.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _faults import Fault, FaultProxy
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _s3 import moto_server  # noqa: F401  (fixture)
from _tiny import DEFAULT, run_cli, run_env, tiny_config, write_config

RUN = "s3tiny"
KEY_ID = "AKIAMUGRPOFAKE7Q3X9Z"
SECRET = "mUgRpO/fAkE+sEcReT/0123456789abcdefXYZw"
PREFECT_KEY = "pnu_mugrpoFakePrefectKey0123456789abcd"

pytestmark = pytest.mark.slow


def config(root: str, endpoint: str, model_dir: Path) -> dict:
    return tiny_config(
        root,
        model_dir,
        run_id=RUN,
        run={"storage_options": {"endpoint_url": endpoint}, "storage_retry": {"max_attempts": 2, "read_timeout_s": 20}},
        generation={"sampling": {"temperature": DEFAULT}},
        train={"lr": DEFAULT},
    )


def prefect_records(api: str) -> str:
    """Every flow run (with its parameters), log and artifact on the test server, as JSON text."""
    texts = []
    for path in ("flow_runs/filter", "logs/filter", "artifacts/filter"):
        offset = 0
        while True:
            req = urllib.request.Request(
                f"{api}/{path}",
                data=json.dumps({"limit": 200, "offset": offset}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                page = json.loads(r.read())
            texts.append(json.dumps(page))
            if len(page) < 200:
                break
            offset += 200
    return "\n".join(texts)


def test_two_stage_run_on_s3_survives_a_stopped_server_resumes_and_leaks_no_secret(
    tmp_path, tiny_model_dir, moto_server, prefect_api
):  # noqa: F811
    import s3fs

    bucket = f"flow-{uuid.uuid4().hex[:8]}"
    direct = s3fs.S3FileSystem(endpoint_url=moto_server, skip_instance_cache=True)
    direct.mkdir(bucket)
    log = tmp_path / "cli.log"
    with FaultProxy(moto_server) as proxy:
        root = f"s3://{bucket}/runs"
        cfg_path = write_config(tmp_path / "run.yaml", config(root, proxy.url, tiny_model_dir))
        env = run_env(
            prefect_api,
            AWS_ACCESS_KEY_ID=KEY_ID,
            AWS_SECRET_ACCESS_KEY=SECRET,
            PREFECT_API_KEY=PREFECT_KEY,
            MUGRPO_CACHE=str(tmp_path / "cache"),
        )
        run_url = f"{root}/{RUN}"

        # 1. The server stops in the middle of stage 0's checkpoint upload (after its model files).
        proxy.add(Fault("down", method="PUT", path="checkpoints/stage=0/step=000002/optimizer.pt"))
        out = run_cli(["run", str(cfg_path)], env, log)
        assert out.returncode == 1, log.read_text()[-5000:]
        assert f"could not write {run_url}/checkpoints/stage=0/step=000002/optimizer.pt" in out.stderr
        assert "after up to 2 attempts" in out.stderr
        proxy.up()
        assert not direct.exists(f"{bucket}/runs/{RUN}/checkpoints/stage=0/step=000002/_COMPLETE")
        assert direct.exists(f"{bucket}/runs/{RUN}/checkpoints/stage=0/step=000001/_COMPLETE")

        # 2. Resume; the server stops again in the middle of stage 1's second shard write.
        proxy.add(Fault("down", method="PUT", path="rollouts/stage=1/shard=00001.parquet"))
        resume = ["resume", run_url, "--storage-option", f"endpoint_url={proxy.url}"]
        out = run_cli(resume, env, log)
        assert out.returncode == 1, log.read_text()[-5000:]
        assert f"could not write {run_url}/rollouts/stage=1/shard=00001.parquet" in out.stderr
        proxy.up()
        # stage 1's generation ran beside the end of stage 0's train job (orchestration.overlap_checkpoint): that
        # job committed before the failure was raised; stage 0's manifest is written by the next resume
        assert direct.exists(f"{bucket}/runs/{RUN}/jobs/stage=0/train.manifest.json")
        assert not direct.exists(f"{bucket}/runs/{RUN}/stages/stage=0.json")
        assert not direct.exists(f"{bucket}/runs/{RUN}/rollouts/stage=1/shard=00001.parquet")

        # 3. Resume to the end.
        out = run_cli(resume, env, log)
        assert out.returncode == 0, log.read_text()[-5000:]
        assert "complete" in out.stdout
        verify = run_cli(["verify", run_url, "--storage-option", f"endpoint_url={proxy.url}"], env, log)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        lease = json.loads(direct.cat_file(f"{bucket}/runs/{RUN}/_lease.json"))
        assert lease["released"] is True

    # Nothing lost or duplicated.
    keys: Counter = Counter()
    for path in direct.glob(f"{bucket}/runs/{RUN}/rollouts/stage=*/shard=*.parquet"):
        stage = int(path.split("stage=")[1].split("/")[0])
        with direct.open(path, "rb") as f:
            t = pq.read_table(f, columns=["prompt_id", "sample_idx"])
        keys.update((stage, p, s) for p, s in zip(t["prompt_id"].to_pylist(), t["sample_idx"].to_pylist(), strict=True))
    assert len(keys) == 2 * 4 * 2 and set(keys.values()) == {1}
    updates = []
    for path in direct.glob(f"{bucket}/runs/{RUN}/train_steps/stage=*/part-*.parquet"):
        with direct.open(path, "rb") as f:
            updates += pq.read_table(f, columns=["update"])["update"].to_pylist()
    assert sorted(updates) == list(range(1, 7))

    # No secret in any output: every object of the run, the CLI output, Prefect's records.
    outputs: dict[str, bytes] = {p: direct.cat_file(p) for p in direct.find(f"{bucket}/runs")}
    assert any(p.endswith("report.html") for p in outputs) and any(p.endswith("run.json") for p in outputs)
    assert any(p.endswith(".parquet") for p in outputs) and any("/stages/" in p for p in outputs)
    outputs["cli output"] = log.read_bytes()
    outputs["prefect flow runs, logs, artifacts"] = prefect_records(prefect_api).encode()
    assert b"mugrpo-run" in outputs["prefect flow runs, logs, artifacts"]  # the records are really there
    assert b"s3tiny" in outputs["prefect flow runs, logs, artifacts"]
    for secret in (KEY_ID, SECRET, PREFECT_KEY):
        leaks = [name for name, data in outputs.items() if secret.encode() in data]
        assert leaks == [], f"{secret[:6]}... found in {leaks}"
