"""The stage flow fans generation out over ``generation.workers`` jobs, on a real local Prefect server
with real job subprocesses and the tiny test model.

A worker that fails past its retries fails the stage with its own error while its sibling commits; the re-run
launches only the failed worker, the generation commit aggregates both worker manifests, and Prefect shows each
worker as its own task run with its logs.
"""

from __future__ import annotations

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import DEFAULT, tiny_config

from mugrpo.commits.manifest import read_job_manifest, read_manifest
from mugrpo.config import config_from_dict
from mugrpo.coordination.fanout import worker_job
from mugrpo.orchestration.runs import init_run
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

RUN = "fanflow"

pytestmark = pytest.mark.slow


def task_runs(flow_run_id) -> dict[str, str]:
    """{task run name: state name} of a flow run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name: r.state.name for r in runs}


def test_a_failed_worker_fails_the_stage_and_alone_is_relaunched(tmp_path, tiny_model_dir, prefect_api):
    from _prefect import flow_run_logs

    from flows.stage import stage_flow

    cfg = config_from_dict(
        tiny_config(
            tmp_path,
            tiny_model_dir,
            run_id=RUN,
            run={"num_stages": 1},
            generation={"prompts_per_stage": 8, "workers": 2, "engine_kwargs": {"num_threads": 1}},
            train={"updates_per_stage": 1, "checkpoint_every": DEFAULT, "skip_zero_variance_groups": DEFAULT},
            eval=DEFAULT,
        )
    )
    init_run(cfg)
    store, layout = Store(str(tmp_path)), RunLayout(RUN)
    # Shard 1 (worker 1's) holds garbage: worker 1 samples shard 3, then cannot read shard 1 back and exits 1.
    store.write_bytes(layout.rollout_shard(0, 1), b"not parquet")

    state = stage_flow(config=cfg.to_json_dict(), stage=0, return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception) as failed:
        state.result()
    assert "stage 0: generate worker 1 of 2 failed past its retries" in getattr(failed.value, "__notes__", [])
    assert "shard=00001.parquet" in str(failed.value)  # the worker's own last lines
    first = state.state_details.flow_run_id
    runs = task_runs(first)
    assert runs["generate-stage-0-worker-0-of-2"] == "Completed"
    assert runs["generate-stage-0-worker-1-of-2"] == "Failed"
    assert read_job_manifest(store, RUN, 0, worker_job("generate", 0, 2)) is not None
    assert read_job_manifest(store, RUN, 0, worker_job("generate", 1, 2)) is None
    assert read_job_manifest(store, RUN, 0, "generate") is None  # no generation commit without every worker
    logs = flow_run_logs(first, wait_for="worker 1 of 2 owns")
    assert any("[generate]" in m and "worker 0 of 2 owns 2" in m for m in logs)
    assert any("[generate]" in m and "worker 1 of 2 owns 2 (1 already written)" in m for m in logs)

    store.delete(layout.rollout_shard(0, 1))
    state = stage_flow(config=cfg.to_json_dict(), stage=0, return_state=True)
    assert state.is_completed(), state.message
    runs = task_runs(state.state_details.flow_run_id)
    assert "generate-stage-0-worker-0-of-2" not in runs  # committed: not relaunched
    assert runs["generate-stage-0-worker-1-of-2"] == "Completed"
    gen = read_job_manifest(store, RUN, 0, "generate")
    assert gen.counts["workers"] == 2 and gen.counts["rows"] == 8 * 2 and len(gen.files) == 4
    stage = read_manifest(store, RUN, 0)
    assert stage is not None and stage.counts["generate/rows"] == 16
