"""bench/resume_scale.py --quick runs end to end (synthetic runs written through the real Store, on a local folder
and on moto S3, each start a real preflight) and reports what it promises: a quick start reads the final policy (and,
mid-run, the checkpoint it resumes from) but no earlier stage's weights or moments; the before arm reads every
committed file twice; the printed ratio, growth, target and 7B projection lines. No timing is asserted."""

from __future__ import annotations

import json

import pytest
from _bench import run_bench


@pytest.mark.slow
def test_resume_scale_quick(tmp_path):
    out = tmp_path / "resume-scale.json"
    proc = run_bench(["bench/resume_scale.py", "--quick", "--work", str(tmp_path), "--json", str(out)], timeout=900)
    result = json.loads(out.read_text())
    cells = result["cells"]
    assert sorted((c["store"], c["stages"]) for c in cells) == [("local", 1), ("local", 4), ("s3", 1), ("s3", 4)]
    for c in cells:
        p, n = c["policy_bytes"], c["stages"]
        for variant, v in c["variants"].items():
            quick, full, before = (v["arms"][a] for a in ("quick", "full", "before"))
            for arm in (quick, full, before):  # the store's counter and the read log agree
                assert arm["bytes_read"] == arm["logged_bytes"] > 0
            kinds = quick["by_kind"]
            # a quick start re-hashes what the next work reads, and no earlier stage's weights or moments
            assert kinds["earlier_weights"] == kinds["earlier_moments"] == 0, (c["store"], n, variant, kinds)
            assert kinds["latest_weights"] == p  # the final policy (finished) / the open stage's policy (mid-run)
            assert kinds["latest_moments"] == (0 if variant == "finished" else 2 * p)  # the checkpoint it resumes from
            assert quick["bytes_read"] <= v["bound_bytes"]
            # full re-hashes every committed file once (a published policy, which its stage's manifest and its own
            # folder both list, is read once and judged against both)
            assert full["by_kind"]["earlier_weights"] + full["by_kind"]["latest_weights"] == p * (n + 1)
            assert full["by_kind"]["earlier_moments"] + full["by_kind"]["latest_moments"] == 2 * p * n
            # before: the same full check twice
            for kind, nbytes in full["by_kind"].items():
                if kind != "other":
                    assert before["by_kind"][kind] == 2 * nbytes
            if c["store"] == "s3":  # S3 vouches by HEAD: requests counted by the server, no GET of earlier weights
                assert quick["requests"]["HEAD"] > 0 and quick["heads"] > 0
            else:
                assert quick["requests"] is None
        if c["store"] == "local":  # a fresh machine: the first quick start hashes everything once, then is warm
            cold = c["variants"]["finished"]["cold_cache"]
            assert cold["first"]["bytes_read"] > cold["next"]["bytes_read"]
            first = cold["first"]["by_kind"]
            assert first["earlier_moments"] + first["latest_moments"] == 2 * p * n  # every checkpoint, once
            # every policy once: the final one, which the next work reads, is hashed (never vouched for), the same
            # read filling the cache
            assert first["earlier_weights"] + first["latest_weights"] == p * (n + 1)
            assert cold["next"]["by_kind"] == c["variants"]["finished"]["arms"]["quick"]["by_kind"]
    assert result["targets"]["bytes"] == {"pass": 8, "of": 8}
    assert {(g["store"], g["variant"]) for g in result["growth"]} == {
        (s, v) for s in ("local", "s3") for v in ("finished", "mid-run")
    }
    rows = {(r["variant"], r["arm"]): r for r in result["projection"]["rows"]}
    assert (rows["finished", "quick"]["policy_files"], rows["finished", "quick"]["moment_files"]) == (1, 0)
    assert (rows["mid-run", "quick"]["policy_files"], rows["mid-run", "quick"]["moment_files"]) == (1, 1)
    assert rows["finished", "before"]["moment_files"] == 8  # 4 checkpoints, hashed twice
    stdout = proc.stdout
    assert "ratio before/quick local finished n=4" in stdout and "ratio before/quick s3 mid-run n=4" in stdout
    assert "target flat" in stdout and "target bytes" in stdout and "7B projection" in stdout
    assert not list(tmp_path.glob("mugrpo-resume-scale-*")), "the bench left its folders behind"
