"""``stages``: one row per committed stage manifest (``schemas.STAGE_VIEW_SCHEMA``); a fork's inherited stage is its
stage too (``inherited_from`` names the run whose manifest it is)."""

from __future__ import annotations

import pyarrow as pa
from pydantic import ValidationError

from mugrpo.sql.discover import TargetError
from mugrpo.sql.views.base import Build
from schemas import STAGE_VIEW_SCHEMA, StageManifest

NAMES = ("stages",)


def create(build: Build) -> None:
    build.view("stages", f"SELECT * FROM {build.register('stages', _stage_rows(build))}")


def _stage_rows(build: Build) -> pa.Table:
    target = build.target
    owners = {rel: run_id for run_id, files in target.runs.items() for rel in files.manifests.values()}
    rows = []
    for rel, data in sorted(build.read_all(list(owners)).items()):
        try:
            m = StageManifest.model_validate_json(data)
        except ValidationError as e:
            raise TargetError(f"{target.store.uri(rel)} is not a valid stage manifest: {e}") from None
        rows.append(
            {
                "run_id": owners[rel],  # a fork's inherited stage is its stage too (the manifest names the parent)
                "inherited_from": m.run_id if m.run_id != owners[rel] else None,
                "stage": m.stage,
                "status": m.status,
                "created_at": m.created_at,
                "num_files": len(m.files),
                "counts": list(m.counts.items()),
                "metrics": list(m.metrics.items()),
                **m.timings.model_dump(),
                "code_version": m.code_version,
                "job_code_versions": list(m.job_code_versions.items()),
            }
        )
    return pa.Table.from_pylist(rows, schema=STAGE_VIEW_SCHEMA)
