"""Arrow schemas of every table mugrpo writes, and their versions.

Each Parquet file carries two metadata keys, ``mugrpo.table`` (which schema) and ``mugrpo.schema_version``.
A reader refuses a file whose table name or version it does not know (see :mod:`mugrpo.commits.tables`), except the
older versions listed in ``OLDER_SCHEMAS``, whose missing columns it reads as NULL or as the value ``OLDER_DEFAULTS``
states.
Bump a table's version whenever its schema changes.
"""

from schemas.manifest import (
    MANIFEST_VERSION,
    STAGE_VIEW_SCHEMA,
    FileRecord,
    JobManifest,
    StageManifest,
    StageTimings,
)
from schemas.tables import (
    EVAL_SCHEMA,
    META_TABLE,
    META_VERSION,
    OLDER_DEFAULTS,
    OLDER_SCHEMAS,
    ROLLOUT_SCHEMA,
    SCHEMA_VERSIONS,
    TABLES,
    TRAIN_STEP_SCHEMA,
)

__all__ = [
    "EVAL_SCHEMA",
    "MANIFEST_VERSION",
    "META_TABLE",
    "META_VERSION",
    "OLDER_DEFAULTS",
    "OLDER_SCHEMAS",
    "ROLLOUT_SCHEMA",
    "SCHEMA_VERSIONS",
    "STAGE_VIEW_SCHEMA",
    "TABLES",
    "TRAIN_STEP_SCHEMA",
    "FileRecord",
    "JobManifest",
    "StageManifest",
    "StageTimings",
]
