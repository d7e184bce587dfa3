"""What every job shares: its spec file, the store, the behavior policy on local disk, timing and console output."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from mugrpo.storage import RetryBudget, Store

#: Process start as seen by the job (set at import of this module, i.e. right after the interpreter started).
PROCESS_START = time.monotonic()

console = Console(stderr=True, soft_wrap=True)  # log lines are not cut at 80 columns when piped

S = TypeVar("S", bound="JobSpec")


class JobSpec(BaseModel):
    """Fields every job spec carries: where the run lives and which stage the job works on."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field(description="Run root URL (local folder or s3://...).")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options (no secrets).")
    storage_retry: RetryBudget = Field(default_factory=RetryBudget, description="Retry budget of S3 requests.")
    run_id: str
    stage: int = Field(ge=0)
    seed: int = 0

    def store(self) -> Store:
        return Store(self.root, self.storage_options, self.storage_retry)

    @staticmethod
    def run_fields(cfg, stage: int) -> dict[str, Any]:
        """The fields above, taken from a run config (:class:`mugrpo.config.Config`) for stage ``stage``."""
        return {
            "root": cfg.run.root,
            "storage_options": cfg.run.storage_options,
            "storage_retry": cfg.run.storage_retry,
            "run_id": cfg.run.id,
            "stage": stage,
            "seed": cfg.run.seed,
        }


def spec_argument(argv: list[str] | None, module: str, spec_cls: type[JobSpec], doc: str | None) -> str:
    """The one argument of a job's command line, ``python -m {module} SPEC``, parsed with argparse.

    ``-h``/``--help`` prints the usage and the job module's docstring (``doc``) and exits 0; a missing or extra
    argument prints the usage and exits 2 (a usage error: the launcher does not retry it).

    Returns:
        SPEC: the path or fsspec URL of the job's JSON spec (a ``spec_cls``).
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The run flow writes each job's spec under {root}/{run_id}/jobs/stage={k}/ and launches the job on it.",
    )
    parser.add_argument("spec", metavar="SPEC", help=f"path or fsspec URL of a {spec_cls.__name__} JSON file")
    return parser.parse_args(sys.argv[1:] if argv is None else argv).spec


def load_spec(url: str, cls: type[S]) -> S:
    """Read and validate a JSON job spec from a path or fsspec URL.

    Raises:
        SystemExit(2): the file is missing or invalid; the message names the file and the bad fields.
    """
    raw_opts = os.environ.get("MUGRPO_STORAGE_OPTIONS", "")
    opts = json.loads(raw_opts) if raw_opts and "://" in url and not url.startswith("file://") else {}
    try:
        with fsspec.open(url, "rb", **opts) as f:
            raw = f.read()
    except FileNotFoundError:
        console.print(f"[red]job spec {url} does not exist[/red]")
        raise SystemExit(2) from None
    try:
        return cls.model_validate_json(raw)
    except ValidationError as e:
        console.print(f"[red]invalid job spec {url}:\n{e}[/red]")
        raise SystemExit(2) from None


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed derived from ``parts`` (e.g. run seed, stage, shard) with sha256: stable across processes."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def local_policy_dir(store: Store, rel: str) -> Path:
    """A local folder holding the committed HF policy at ``rel``: the folder itself on a local store, else a
    verified download into a cache folder keyed by the store URL and path.

    ``rel`` is a committed HF dir (``policies/stage=k``) or a committed training checkpoint
    (``checkpoints/stage=k/step=n``), whose ``model/`` subfolder is then returned: the behavior policy of a stage
    whose policy was not published (``orchestration.publish_policy_every > 1``).

    Raises:
        FileNotFoundError: the policy folder was never committed (no ``_COMPLETE`` marker).
        mugrpo.storage.ChecksumError: a file of it differs from its marker's sha256 (names the file).
    """
    if not store.is_complete_dir(rel):
        raise FileNotFoundError(f"policy {store.uri(rel)} is not committed (no _COMPLETE marker)")
    local = store.local_path(rel)
    if local is not None:
        verify_committed_dir(store, rel)
    else:
        cache_root = Path(os.environ.get("MUGRPO_CACHE", Path(tempfile.gettempdir()) / "mugrpo-cache"))
        key = hashlib.sha256(store.uri(rel).encode()).hexdigest()[:16]
        local = cache_root / key
        if not (local / ".verified").exists():
            store.download_dir(rel, local)
            (local / ".verified").touch()
    if not (local / "config.json").exists() and (local / "model" / "config.json").exists():
        return local / "model"  # a training checkpoint: its HF policy dir
    return local


def verify_committed_dir(store: Store, rel: str) -> None:
    """Re-hash (streamed) every file of the committed folder ``rel`` against its ``_COMPLETE`` marker.

    Raises:
        mugrpo.storage.ChecksumError: names the first file that differs.
        FileNotFoundError: a listed file is missing.
    """
    from mugrpo.storage import COMPLETE_MARKER

    for name, digest in store.read_json(f"{rel}/{COMPLETE_MARKER}")["files"].items():
        store.verify_file(f"{rel}/{name}", digest)


@contextmanager
def refuse_untrusted(job: str, stage: int) -> Iterator[None]:
    """Turn a tampered input (:class:`~mugrpo.storage.ChecksumError`, naming the file) or a lost run lease
    (:class:`~mugrpo.lease.LeaseFenced`) into one error line and exit code 2: running the job again cannot fix
    either, so the launcher does not retry it."""
    from mugrpo.lease import LeaseFenced
    from mugrpo.storage import ChecksumError

    try:
        yield
    except ChecksumError as e:
        fail(f"{job} stage {stage}: refusing a tampered input: {e}", 2)
    except LeaseFenced as e:
        fail(f"{job} stage {stage}: {e}", 2)


def since_start() -> float:
    """Seconds since this job process started (used for the switch-overhead timing T_switch)."""
    return time.monotonic() - PROCESS_START


def fail(message: str, code: int = 1) -> None:
    """Print a clear error and exit the job with ``code``."""
    console.print(f"[red]error:[/red] {message}")
    sys.exit(code)
