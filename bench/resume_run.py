"""The committed-files check a start makes, timed on an existing run: quick (what a start does now) against
full (the old check, once) and before (the old check twice: the command line's, then the run flow's again).

    python bench/resume_run.py runs/smollm2-arithmetic            # 3 rounds, arms alternated
    python bench/resume_run.py s3://bucket/runs/RUN -o endpoint_url=http://127.0.0.1:9000

Each arm opens a fresh store and runs :func:`mugrpo.commits.verify.refuse_corrupted` on the run's stored config; on
a local store the run's pages are dropped from the page cache first (``posix_fadvise(DONTNEED)``), so every arm reads
the disk as a start in a fresh process long after the run wrote does. Prints per arm the seconds, the bytes of file
content read (:attr:`mugrpo.storage.store.Store.bytes_read`) and the HEAD/stat requests, then the medians and the
ratios quick/before and quick/full. The whole `mugrpo resume` adds the command line's start-up, the temporary
Prefect server and the report around it; bench/resume_scale.py measures the growth with history on synthetic runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ARMS = ("quick", "full", "before")


def main(argv: list[str] | None = None) -> int:
    from bench.resume_scale import drop_page_cache
    from mugrpo.cli.app import stored_config
    from mugrpo.commits.verify import refuse_corrupted
    from mugrpo.orchestration.runs import open_store
    from mugrpo.sql.cli import parse_storage_options

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run folder or URL ROOT/RUN_ID")
    parser.add_argument("-o", "--storage-option", action="append", default=[], help="fsspec option KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    cfg = stored_config(args.run, None, parse_storage_options(args.storage_option))
    results: dict[str, list[tuple[float, int, int]]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
            store = open_store(cfg)
            if store.is_local:
                drop_page_cache(Path(store.full(cfg.run.id)))
            t0 = time.perf_counter()
            for _ in range(2 if arm == "before" else 1):
                report = refuse_corrupted(store, cfg.run.id, cfg.run.num_stages, cfg.layout, quick=arm == "quick")
            seconds = time.perf_counter() - t0
            results[arm].append((seconds, store.bytes_read, store.heads))
            print(
                f"round {r} {arm:6s} {seconds:7.2f} s  {store.bytes_read / 2**20:9.1f} MiB read  {store.heads:4d} "
                f"HEAD/stat  ({report.total_files} files)",
                flush=True,
            )
    median = {arm: statistics.median(s for s, _, _ in v) for arm, v in results.items()}
    for arm in ARMS:
        print(f"{arm:6s} median {median[arm]:.2f} s, {results[arm][0][1] / 2**30:.2f} GiB read")
    quick = median["quick"]
    print(f"ratio quick/before {quick / median['before']:.3f}  quick/full {quick / median['full']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
