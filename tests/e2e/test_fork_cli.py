"""`mugrpo fork` end to end on S3: the real CLI, real Prefect flows on a local Prefect server, real job
subprocesses, a real S3 API (moto behind the logging proxy of tests/_faults.py).

A 2-stage parent runs with `mugrpo run`; `mugrpo fork PARENT --at-stage 1 --reuse-rollouts train.lr=...` then makes
and runs a child. Every request the child's commands send is logged: the child writes no byte of the parent's stage-0
data (rollouts, train_steps, evals, policies, checkpoints) under its own prefix, only the verbatim manifests that
reference it, and re-scores stage 1 from the parent's stored responses (no generate engine starts). `mugrpo verify`
of the child checks the referenced parent files; the `lineage` view shows the family; a second fork with the same id
is refused with one block and exit 3.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest
from _faults import FaultProxy
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _s3 import moto_server  # noqa: F401  (fixture)
from _tiny import run_cli, run_env, tiny_config, write_config

PARENT, CHILD = "s3parent", "s3child"
#: The folders of the parent's stage-0 data and of the policies the child builds on: never written under the child.
REFERENCED = (
    "rollouts/stage=0",
    "train_steps/stage=0",
    "evals/stage=0",
    "checkpoints/stage=0",
    "policies/stage=0",
    "policies/stage=1",
)

pytestmark = pytest.mark.slow


def test_fork_on_s3_writes_no_byte_of_referenced_stages(tmp_path, tiny_model_dir, moto_server, prefect_api):  # noqa: F811
    import s3fs

    bucket = f"fork-{uuid.uuid4().hex[:8]}"
    direct = s3fs.S3FileSystem(endpoint_url=moto_server, skip_instance_cache=True)
    direct.mkdir(bucket)
    log = tmp_path / "cli.log"
    env = run_env(prefect_api, MUGRPO_CACHE=str(tmp_path / "cache"))
    with FaultProxy(moto_server) as proxy:
        root = f"s3://{bucket}/runs"
        cfg = tiny_config(
            root, tiny_model_dir, run_id=PARENT, run={"storage_options": {"endpoint_url": proxy.url}}, eval={}
        )
        out = run_cli(["run", str(write_config(tmp_path / "parent.yaml", cfg))], env, log)
        assert out.returncode == 0, log.read_text()[-5000:]

        proxy.clear()
        option = ["--storage-option", f"endpoint_url={proxy.url}"]
        fork = ["fork", f"{root}/{PARENT}", "--at-stage", "1", "--id", CHILD, "--reuse-rollouts", "train.lr=0.002"]
        out = run_cli([*fork, *option], env, log)
        assert out.returncode == 0, log.read_text()[-5000:]
        assert "stages 0..0 referenced from the parent" in out.stdout and "complete" in out.stdout
        written = [unquote(p) for m, p, _ in proxy.log if m == "PUT" and f"/{CHILD}/" in p]
        assert written, "the child wrote nothing"
        copied = [p for p in written if any(f"/{CHILD}/{folder}" in p for folder in REFERENCED)]
        assert copied == [], f"the child wrote data of referenced stages: {copied}"
        assert any(p.endswith(f"/{CHILD}/stages/stage=0.json") for p in written)  # the verbatim manifest
        assert any(f"/{CHILD}/policies/stage=2/" in p for p in written)  # its own final policy
        child_files = direct.find(f"{bucket}/runs/{CHILD}", detail=True)
        referenced_bytes = sum(
            info["size"] for path, info in child_files.items() if any(f"/{f}" in path for f in REFERENCED)
        )
        assert referenced_bytes == 0
        assert direct.exists(f"{bucket}/runs/{CHILD}/rollouts/stage=1/shard=00000.parquet")  # re-scored, its own

        def responses(run: str) -> list:  # stage 1 was not sampled again: the parent's responses, re-scored
            rows = pq.read_table(f"{bucket}/runs/{run}/rollouts/stage=1", filesystem=direct).to_pylist()
            return sorted((r["prompt_id"], r["sample_idx"], r["response_token_ids"]) for r in rows)

        assert responses(CHILD) == responses(PARENT)

        verify = run_cli(["verify", f"{root}/{CHILD}", *option], env, log)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        query = "SELECT run_id, parent_run_id, fork_stage FROM lineage ORDER BY run_id"
        sql = run_cli(["sql", root, query, *option], env, log)
        assert sql.returncode == 0, sql.stderr
        assert CHILD in sql.stdout and PARENT in sql.stdout

        again = run_cli([*fork, *option], env, log)
        assert again.returncode == 3, again.stdout + again.stderr
        assert again.stderr.count("Error:") == 1 and "exists" in again.stderr
