"""SQL at scale: write a synthetic run of N rollout rows with realistic token lists, then time typical queries.

    python bench/sql_scale.py                    # 1,000,000 rollouts, ~100 prompt + ~300 response tokens each
    python bench/sql_scale.py --rows 2000 --out /tmp/b

Shards are generated one at a time with numpy (memory stays at one shard) and written through
:func:`mugrpo.commits.tables.write_table`, exactly as generation jobs write them. Queries run through
:func:`mugrpo.sql.connect` (the read-only ``mugrpo://`` filesystem), and the stage aggregation also through DuckDB's
native reader for reference. Target: aggregation by stage over 1M rows in under 1 s; the ratio target/actual is printed
(> 1 is met).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from mugrpo.commits.manifest import new_manifest, write_manifest
from mugrpo.commits.tables import write_table
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import ROLLOUT_SCHEMA

VOCAB = 49_152  # SmolLM2's vocabulary
TARGET_SECONDS = 1.0  # aggregation by stage over 1M rows

QUERIES = {
    "aggregation by stage": (
        "SELECT stage, count(*) AS rollouts, avg(reward) AS mean_reward, avg(num_tokens) AS mean_tokens, "
        "avg((finish_reason = 'length')::DOUBLE) AS truncated, avg((advantage < 0)::DOUBLE) AS negative "
        "FROM rollouts GROUP BY stage ORDER BY stage"
    ),
    "worst responses of a prompt": (
        "SELECT stage, sample_idx, reward, advantage, num_tokens, left(response_text, 80) AS response "
        "FROM rollouts WHERE prompt_id = '{prompt_id}' ORDER BY reward, num_tokens DESC LIMIT 5"
    ),
    "mean token log-prob by stage (list scan)": (
        "SELECT stage, avg(list_avg(behavior_logprobs)) AS mean_logprob, sum(len(response_token_ids)) AS tokens "
        "FROM rollouts GROUP BY stage ORDER BY stage"
    ),
}


class ShardGenerator:
    """Synthetic rollouts with the shapes of real ones: whole groups per shard, per-group prompts, Zipf tokens."""

    def __init__(self, run_id: str, group_size: int, prompt_tokens: int, response_tokens: int, seed: int):
        self.run_id, self.g = run_id, group_size
        self.prompt_tokens, self.response_tokens = prompt_tokens, response_tokens
        self.rng = np.random.default_rng(seed)
        words = np.array("the of a to is and we so x y answer therefore compute total each step boxed".split())
        self.corpus = " ".join(self.rng.choice(words, 400_000))  # text is cut from this at random offsets
        self.next_prompt = 0

    def _lists(self, lengths: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, typ))

    def _texts(self, chars: np.ndarray) -> pa.Array:
        starts = self.rng.integers(0, len(self.corpus) - int(chars.max()) - 1, len(chars))
        return pa.array([self.corpus[s : s + c] for s, c in zip(starts.tolist(), chars.tolist(), strict=True)])

    def shard(self, stage: int, rows: int) -> pa.Table:
        """``rows`` rollouts (a multiple of the group size) of ``stage``."""
        rng, g = self.rng, self.g
        groups = rows // g
        ids = np.arange(self.next_prompt, self.next_prompt + groups)
        self.next_prompt += groups
        prompt_len_g = rng.integers(self.prompt_tokens // 2, self.prompt_tokens * 3 // 2 + 1, groups)
        prompt_len = np.repeat(prompt_len_g, g)
        prompt_tok_g = np.minimum(rng.zipf(1.1, int(prompt_len_g.sum())), VOCAB - 1).astype(np.int32)
        prompt_starts = np.concatenate([[0], np.cumsum(prompt_len_g)])
        prompt_tok = np.concatenate(
            [prompt_tok_g[prompt_starts[i] : prompt_starts[i + 1]] for i in np.repeat(np.arange(groups), g)]
        )
        max_new = self.response_tokens * 2
        resp_len = np.minimum(rng.gamma(4.0, self.response_tokens / 4.0, rows).astype(np.int32) + 1, max_new)
        n_resp = int(resp_len.sum())
        resp_tok = np.minimum(rng.zipf(1.1, n_resp), VOCAB - 1).astype(np.int32)
        logprobs = (-rng.exponential(0.35, n_resp)).astype(np.float32)
        p_correct = 0.2 + 0.1 * stage
        reward = (rng.random(rows) < p_correct).astype(np.float32)
        by_group = reward.reshape(groups, g)
        std = by_group.std(axis=1, keepdims=True)
        advantage = ((by_group - by_group.mean(axis=1, keepdims=True)) / (std + 1e-6)).reshape(-1)
        zero_var = np.repeat(std[:, 0] == 0, g)
        prompt_id = pa.array([f"{self.run_id}-p{i:08d}" for i in np.repeat(ids, g).tolist()])
        components = pa.MapArray.from_arrays(
            pa.array(np.arange(0, 2 * rows + 1, 2, dtype=np.int32)),
            pa.array(np.tile(["correctness", "format"], rows)),
            pa.array(np.stack([reward, np.ones(rows, np.float32)], axis=1).reshape(-1)),
        )
        now = pa.array(np.full(rows, int(datetime.now(UTC).timestamp() * 1e6)), pa.timestamp("us", tz="UTC"))
        cols = {
            "run_id": pa.array([self.run_id] * rows),
            "stage": pa.array(np.full(rows, stage, np.int32)),
            "policy_version": pa.array(np.full(rows, stage * 64, np.int64)),
            "prompt_id": prompt_id,
            "sample_idx": pa.array(np.tile(np.arange(g, dtype=np.int32), groups)),
            "group_size": pa.array(np.full(rows, g, np.int32)),
            "prompt_text": self._texts(np.repeat(prompt_len_g * 4, g)),
            "prompt_token_ids": self._lists(prompt_len, prompt_tok, pa.int32()),
            "response_text": self._texts(resp_len * 4),
            "response_token_ids": self._lists(resp_len, resp_tok, pa.int32()),
            "behavior_logprobs": self._lists(resp_len, logprobs, pa.float32()),
            "finish_reason": pa.array(np.where(resp_len >= max_new, "length", "stop")),
            "num_tokens": pa.array(resp_len),
            "reward": pa.array(reward),
            "reward_components": components,
            "reward_status": pa.array(["ok"] * rows),
            "ground_truth": pa.array((np.repeat(ids, g) % 1000).astype(str)),
            "extracted_answer": pa.array(np.where(reward > 0, (np.repeat(ids, g) % 1000).astype(str), "7")),
            "advantage": pa.array(advantage.astype(np.float32)),
            "zero_variance": pa.array(zero_var),
            "temperature": pa.array(np.ones(rows, np.float32)),
            "top_p": pa.array(np.ones(rows, np.float32)),
            "top_k": pa.array(np.zeros(rows, np.int32)),
            "min_p": pa.array(np.zeros(rows, np.float32)),
            "seed": pa.array(np.arange(rows, dtype=np.int64)),
            "engine": pa.array(["vllm"] * rows),
            "created_at": now,
            "is_probe": pa.array(np.zeros(rows, bool)),
        }
        for f in ROLLOUT_SCHEMA:  # AGPO's probe statistics: NULL in rows sampled without AGPO
            cols.setdefault(f.name, pa.nulls(rows, f.type))
        return pa.table(cols).cast(ROLLOUT_SCHEMA)


def write_run(store: Store, run_id: str, args: argparse.Namespace) -> tuple[int, float]:
    """Write ``args.rows`` rollouts over ``args.stages`` stages; returns (rows written, seconds)."""
    gen = ShardGenerator(run_id, args.group_size, args.prompt_tokens, args.response_tokens, args.seed)
    layout = RunLayout(run_id)
    per_stage = args.rows // args.stages
    shard_rows = max(args.group_size, args.shard_rows // args.group_size * args.group_size)
    written, t0 = 0, time.perf_counter()
    for stage in range(args.stages):
        want = per_stage if stage < args.stages - 1 else args.rows - written
        files, shard, left = [], 0, want
        while left > 0:
            n = min(shard_rows, left)
            n = -(-n // args.group_size) * args.group_size  # whole groups
            table = gen.shard(stage, n).slice(0, left) if n > left else gen.shard(stage, n)
            rel = layout.rollout_shard(stage, shard)
            files.append(write_table(store, rel, table, "rollouts", run_rel=layout.rel(rel)))
            left -= table.num_rows
            written += table.num_rows
            shard += 1
        write_manifest(store, new_manifest(run_id, stage, files, counts={"rollouts": want}))
    return written, time.perf_counter() - t0


def time_query(run: Callable[[], pa.Table], repeats: int) -> tuple[float, float, int]:
    """(first run seconds, best of the next ``repeats`` runs, rows returned)."""
    t0 = time.perf_counter()
    rows = run().num_rows
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return first, min(times) if times else first, rows


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rollout rows to write")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--shard-rows", type=int, default=25_000, help="rows per Parquet shard")
    ap.add_argument("--group-size", type=int, default=8, help="G: samples per prompt")
    ap.add_argument("--prompt-tokens", type=int, default=100, help="mean prompt length (uniform 0.5x..1.5x)")
    ap.add_argument("--response-tokens", type=int, default=300, help="mean response length (gamma, capped at 2x)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each query after the first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="root folder to write (kept); default: a temporary folder (deleted)")
    args = ap.parse_args(argv)

    out = args.out or Path(tempfile.mkdtemp(prefix="mugrpo-sql-bench-"))
    try:
        store = Store(str(out))
        rows, write_s = write_run(store, "bench", args)
        size = dir_bytes(out / "bench" / "rollouts")
        n_files = sum(1 for _ in (out / "bench" / "rollouts").rglob("*.parquet"))
        run_dir = str(out / "bench")
        results = []
        with connect(run_dir) as cat:
            prompt_id = cat.arrow("SELECT prompt_id FROM rollouts WHERE stage = 1 LIMIT 1").column(0)[0].as_py()
            for name, sql in QUERIES.items():
                query = sql.format(prompt_id=prompt_id)
                results.append((name, *time_query(lambda q=query: cat.arrow(q), args.repeats)))
        import duckdb

        native = duckdb.connect()
        glob = f"{run_dir}/rollouts/*/*.parquet"
        sql = QUERIES["aggregation by stage"].replace(
            "FROM rollouts", f"FROM read_parquet('{glob}', hive_partitioning = true, hive_types = {{'stage': INTEGER}})"
        )
        results.append(
            (
                "aggregation by stage, DuckDB native reader",
                *time_query(lambda: native.sql(sql).to_arrow_table(), args.repeats),
            )
        )
        native.close()
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)

    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, duckdb {__import__('duckdb').__version__}")
    print(
        f"rows written: {rows:,} rollouts in {n_files} shards over {args.stages} stages "
        f"(G={args.group_size}, ~{args.prompt_tokens} prompt + ~{args.response_tokens} response tokens)"
    )
    print(
        f"write time: {write_s:.1f} s ({rows / write_s:,.0f} rows/s); on disk: {size / 2**20:,.1f} MiB "
        f"({size / rows:,.0f} B/row)"
    )
    print()
    best = f"best of {args.repeats} (s)"
    print(f"| {'query':<45} | {'first (s)':>9} | {best:>13} | {'rows':>4} |")
    print(f"|{'-' * 47}|{'-' * 10}:|{'-' * 14}:|{'-' * 5}:|")
    for name, first, fastest, n in results:
        print(f"| {name:<45} | {first:>9.3f} | {fastest:>13.3f} | {n:>4} |")
    agg_best = results[0][2]
    print()
    print(
        f"aggregation by stage: {agg_best:.3f} s (best of {args.repeats}) over {rows:,} rows; target "
        f"{TARGET_SECONDS:.1f} s for 1,000,000 rows; target/actual = {TARGET_SECONDS / agg_best:.2f} (> 1 means met)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
