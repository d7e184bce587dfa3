"""Chaos harness (docs/reliability.md): SIGKILL a random process of a tiny real run at N moments drawn from a seed
(every third moment of an arm stops the run with SIGINT or SIGTERM instead, and checks the stop; some moments evict
one job with SIGTERM and its grace, as Kubernetes evicts a pod, and check the eviction), retry or resume after each,
then check the resume invariants against an uninterrupted run and count the work each moment lost.

    python bench/chaos.py --seed 0 --moments 20     # full run (docs/reliability.md records one)
    python bench/chaos.py --quick                   # CI: 7 moments, 2 stages (tests/e2e/test_chaos.py runs it)

Victims: the flow process, a generate / train / eval job (cold execution), a segment job (warm execution), a
verifier worker, or the whole tree. Arms: cold and warm execution of the same tiny run (tiny random Llama with the
real SmolLM2 tokenizer, real GSM8K rows, real job processes, a local Prefect server). It prints one line per moment,
then ``N/N resumed, 0 lost, 0 duplicated, weights equal, ...``, the work lost per moment kind (``SIGKILL x3: 0.3
updates, 0.0 shards; eviction x2: ...``: completed train updates trained again, generation shards sampled again) and
what differed, and exits 1 when an invariant broke or a stop or an eviction broke a promise.
The logic lives in ``bench/support/chaos/``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    from bench.support.chaos import QUICK, ChaosSettings, run_chaos
    from mugrpo.policy.models import make_tiny_random_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="draws the moments (arm, victim role, delay)")
    ap.add_argument("--moments", type=int, default=None, help="kills, stops and evictions (default 20; --quick: 7)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="CI mode: 7 moments on a 2-stage run, final evaluation only, one reference run shared by the arms",
    )
    ap.add_argument("--arms", default="cold,warm", help="comma-separated: cold, warm")
    ap.add_argument("--work", type=Path, default=None, help="folder for the runs and logs (default: a temp dir)")
    ap.add_argument("--data", type=Path, default=DATA, help="the shared data folder (gsm8k/train.jsonl, test.jsonl)")
    args = ap.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="mugrpo-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_random_model(work / "tiny-policy", seed=0)
    mode = {**QUICK} if args.quick else {"moments": 20, "num_stages": 3}
    if args.moments:
        mode["moments"] = args.moments
    settings = ChaosSettings(
        data_dir=args.data,
        model_dir=model,
        seed=args.seed,
        arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()),
        **mode,
    )
    t0 = time.monotonic()
    print(f"chaos: seed {settings.seed}, {settings.moments} moments, arms {settings.arms}, work folder {work}")
    report = run_chaos(settings, work=work, say=lambda line: print(line, flush=True))
    for arm in report.arms:
        shared = " (the shared reference)" if settings.shared_reference else ""
        print(
            f"{arm.arm}: uninterrupted {arm.reference_s:.0f} s{shared}; under chaos {arm.chaos_s:.0f} s "
            f"({arm.killed} moments, {arm.not_reached} not reached)"
        )
    print(f"total {time.monotonic() - t0:.0f} s")
    print(report.summary)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
