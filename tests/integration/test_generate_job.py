"""The generation job end to end on a tiny random model with the real SmolLM2 tokenizer.

Covers: sharded Parquet output, SIGKILL mid-shard + re-run (every (stage, prompt_id, sample_idx) exactly once and
identical to an uninterrupted run), bad prompts (skip and count, or fail), and an engine failure that commits
nothing for its shard.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import _tiny
import pyarrow as pa
import pytest
from transformers import AutoTokenizer

from mugrpo.commits.manifest import read_job_manifest, verify_manifest
from mugrpo.commits.tables import read_table
from mugrpo.common.faults import FAULT_ENV
from mugrpo.data.datasets import load_problems
from mugrpo.data.prompts import encode_prompt, render_prompt
from mugrpo.engines.base import ROLLOUT_ENGINES
from mugrpo.generation import GenerateSpec, GenerationError, run_generate, select_problems
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

RUN = "gen"


def make_spec(root: Path, **over) -> GenerateSpec:
    return _tiny.generate_spec(root, RUN, **over)


def with_policy(root: Path, tiny_model_dir: Path) -> Path:
    _tiny.with_policy(root, tiny_model_dir, RUN)
    return root


def all_rollouts(root: Path, stage: int = 0) -> pa.Table:
    store = Store(str(root))
    layout = RunLayout("gen")
    names = [n for n in store.listdir(layout.rollouts_dir(stage)) if n.endswith(".parquet")]
    tables = [read_table(store, f"{layout.rollouts_dir(stage)}/{n}", "rollouts") for n in names]
    return pa.concat_tables(tables).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])


def launch(spec: GenerateSpec, tmp: Path, **env: str) -> subprocess.Popen:
    spec_path = _tiny.write_spec(spec, tmp / f"spec-{time.monotonic_ns()}.json")
    return _tiny.start_job("generate", spec_path, env=_tiny.job_env(**env))


@pytest.mark.slow
def test_sigkill_mid_shard_then_rerun_gives_each_rollout_exactly_once(tmp_path, tiny_model_dir):
    # Uninterrupted reference run.
    ref_root = with_policy(tmp_path / "ref", tiny_model_dir)
    proc = launch(make_spec(ref_root), tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    reference = all_rollouts(ref_root)

    root = with_policy(tmp_path / "killed", tiny_model_dir)
    spec = make_spec(root)
    # shard 1's write is held open (between its temporary file and the rename) for 60 s, so the SIGKILL that
    # follows shard 0's commit lands mid-shard for sure, however late this process gets to send it
    proc = launch(spec, tmp_path, **{FAULT_ENV: "rollouts/stage=0/shard=00001:60"})
    first_shard = root / RunLayout("gen").rollout_shard(0, 0)
    deadline = time.monotonic() + 600
    while not first_shard.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-way through shard 1
    proc.wait(timeout=60)
    assert read_job_manifest(Store(str(root)), "gen", 0, "generate") is None
    written_before = sorted(p.name for p in first_shard.parent.glob("shard=*.parquet"))
    assert "shard=00001.parquet" not in written_before and len(written_before) < 3

    proc = launch(spec, tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "already written" in out
    table = all_rollouts(root)
    keys = Counter(
        zip(table["stage"].to_pylist(), table["prompt_id"].to_pylist(), table["sample_idx"].to_pylist(), strict=True)
    )
    assert len(keys) == 6 * 3 and set(keys.values()) == {1}
    # Same seed, same config: the resumed run produced the same rollouts as the uninterrupted one.
    for col in ("prompt_id", "sample_idx", "response_token_ids", "behavior_logprobs", "reward", "advantage"):
        assert table[col].to_pylist() == reference[col].to_pylist(), col
    manifest = read_job_manifest(Store(str(root)), "gen", 0, "generate")
    assert manifest.counts["rows"] == 18 and len(manifest.files) == 3
    verify_manifest(Store(str(root)), manifest)


def test_rows_are_complete_groups_with_consistent_fields(tmp_path, tiny_model_dir):
    root = with_policy(tmp_path, tiny_model_dir)
    manifest = run_generate(make_spec(root, num_prompts=4))
    table = all_rollouts(root)
    rows = table.to_pylist()
    assert manifest.counts["rows"] == len(rows) == 12
    for r in rows:
        assert r["num_tokens"] == len(r["response_token_ids"]) == len(r["behavior_logprobs"]) > 0
        assert all(lp <= 0.0 for lp in r["behavior_logprobs"])
        assert r["finish_reason"] in ("stop", "length")
        assert r["group_size"] == 3 and r["engine"] == "transformers"
        assert set(dict(r["reward_components"])) == {"math_correctness", "format"}
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["prompt_id"], []).append(r)
    for group in by_group.values():
        assert sorted(r["sample_idx"] for r in group) == [0, 1, 2]
        adv_sum = sum(r["advantage"] for r in group)
        assert abs(adv_sum) < 1e-5  # group-normalized advantages sum to zero
        rewards = {r["reward"] for r in group}
        assert all(r["zero_variance"] == (len(rewards) == 1) for r in group)
    # Shards hold whole groups.
    store = Store(str(root))
    for name in store.listdir(RunLayout("gen").rollouts_dir(0)):
        shard = read_table(store, f"{RunLayout('gen').rollouts_dir(0)}/{name}", "rollouts")
        assert set(Counter(shard["prompt_id"].to_pylist()).values()) == {3}
    # A re-run of a committed job is a no-op.
    assert run_generate(make_spec(root, num_prompts=4)).created_at == manifest.created_at


def test_too_long_prompts_are_skipped_and_counted_or_fail(tmp_path, tiny_model_dir):
    root = with_policy(tmp_path, tiny_model_dir)
    # GSM8K prompts with the chat template are ~80-200 tokens: a 150-token window skips the long ones.
    spec = make_spec(root, num_prompts=4, max_context=150)
    # Which prompts overflow, computed independently: rendered prompt tokens > context - max_new_tokens.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    selected = select_problems(load_problems(spec.dataset)[0], spec.seed, spec.prompt_start, spec.num_prompts)
    lengths = {
        p.prompt_id: len(encode_prompt(tokenizer, render_prompt(tokenizer, p.question, spec.prompt))) for p in selected
    }
    too_long = {pid for pid, n in lengths.items() if n > 150 - spec.sampling.max_new_tokens}
    assert 0 < len(too_long) < 4, lengths  # the window must split the 4 prompts for this test to mean anything
    manifest = run_generate(spec)
    assert manifest.counts["skipped_too_long"] == len(too_long)
    assert manifest.counts["rows"] == (4 - len(too_long)) * 3
    assert set(all_rollouts(root)["prompt_id"].to_pylist()) == set(lengths) - too_long
    with pytest.raises(GenerationError, match=r"prompt [0-9a-f]{16} \(.*train.jsonl:\d+\) is too_long"):
        run_generate(
            make_spec(
                with_policy(tmp_path / "b", tiny_model_dir), num_prompts=4, max_context=150, on_bad_prompt="error"
            )
        )


class _FailingSecondCall:
    """A test-only engine: the real TransformersEngine, except its 2nd generate call raises like an OOM would."""

    def __init__(self, model_dir, **kw):
        from mugrpo.engines import make_engine

        self.inner = make_engine("transformers", model_dir, **kw)
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        if self.calls == 2:
            raise MemoryError("simulated out of memory")
        return self.inner.generate(prompts, params)

    def close(self):
        self.inner.close()


ROLLOUT_ENGINES.register("test-fail-second")(_FailingSecondCall)


def test_engine_failure_commits_nothing_for_its_shard(tmp_path, tiny_model_dir):
    root = with_policy(tmp_path, tiny_model_dir)
    with pytest.raises(GenerationError, match=r"shard 1 \(prompts .*\) failed .*MemoryError: simulated out of memory"):
        run_generate(make_spec(root, engine="test-fail-second"))
    store = Store(str(root))
    assert store.listdir(RunLayout("gen").rollouts_dir(0)) == ["shard=00000.parquet"]
    assert read_job_manifest(store, "gen", 0, "generate") is None
    # The re-run with a working engine completes the missing shards.
    manifest = run_generate(make_spec(root))
    assert manifest.counts["rows"] == 18


def test_the_job_reports_progress_by_tokens_from_its_first_line(tmp_path, tiny_model_dir):
    """A real job process: its first line comes before the engine's imports, then the live progress line (at once,
    then every 10 s), and the final line counts exactly the tokens the committed rollouts hold."""
    import re

    root = with_policy(tmp_path, tiny_model_dir)
    proc = launch(make_spec(root, num_prompts=4), tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("generate: job started (pid "), out
    assert any(line.startswith("generate stage 0: starting") for line in lines), out
    final = [
        m
        for line in lines
        if (m := re.match(r"generate stage 0: (\d+) tokens \([\d.]+ tok/s\), (\d+)/4 prompts", line))
    ]
    assert final and final[-1].group(2) == "4", out
    assert int(final[-1].group(1)) == sum(all_rollouts(root)["num_tokens"].to_pylist())
