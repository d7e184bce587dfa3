"""The run flow: K stage flows in order, then the evaluation of the final policy."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact

from flows.stage import launch, stage_flow
from mugrpo.config import config_from_dict
from mugrpo.manifest import read_job_manifest
from mugrpo.runs import init_run, write_final_eval_spec


@flow(name="mugrpo-run", log_prints=True)
def run_flow(config: dict[str, Any]) -> dict[str, Any]:
    """Run or resume a whole run. Object storage decides what is done: committed stages and jobs are skipped.

    Raises:
        mugrpo.runs.ConfigMismatchError: the run id exists with a different config.
    """
    cfg = config_from_dict(config, source="run_flow(config)")
    logger = get_run_logger()
    t0 = time.monotonic()
    store = init_run(cfg)
    logger.info("run %s lives at %s", cfg.run.id, store.uri(cfg.run.id))
    results = []
    for k in range(cfg.run.num_stages):
        results.append(stage_flow(config=cfg.to_json_dict(), stage=k))
    final = {}
    spec = write_final_eval_spec(cfg)
    if spec is not None:
        with tags(f"run:{cfg.run.id}", "final-eval"):
            if read_job_manifest(store, cfg.run.id, cfg.run.num_stages, "eval") is None:
                launch(cfg, "eval", spec, cfg.run.num_stages)
        final = read_job_manifest(store, cfg.run.id, cfg.run.num_stages, "eval").metrics
    rows = ["| policy | " + " | ".join(sorted(final)) + " |", "|---|" + "---|" * len(final)]
    values = " | ".join(f"{final[k]:.3f}" for k in sorted(final))
    rows.append(f"| stage={cfg.run.num_stages} (final) | {values} |")
    create_markdown_artifact(
        markdown=f"### Run `{cfg.run.id}` complete\n\nStored at `{store.uri(cfg.run.id)}`\n\n" + "\n".join(rows),
        key=f"{cfg.run.id.lower().replace('_', '-').replace('.', '-')}-final",
        description=f"mugrpo run {cfg.run.id}: final evaluation",
    )
    return {"run_id": cfg.run.id, "uri": store.uri(cfg.run.id), "stages": len(results), "final_eval": final,
            "seconds": time.monotonic() - t0}
