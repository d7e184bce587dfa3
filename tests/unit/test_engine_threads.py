"""``generation.engine_kwargs.num_threads: auto``: the schedule's rule (mugrpo.config.threads) and what a job's spec
records."""

from __future__ import annotations

import pytest

from mugrpo.config import config_from_dict
from mugrpo.config.threads import engine_options, job_threads, machine_width
from mugrpo.evaluation.worker import EvalSpec
from mugrpo.generation import GenerateSpec


def config(tmp_path, **sections):
    data = {
        "run": {"id": "threads", "root": str(tmp_path), "num_stages": 1},
        "model": {"source": "tiny", "dtype": "float32"},
        "eval": {
            "benchmarks": [
                {"dataset": {"name": "a", "path": "a.jsonl", "answer_kind": "gsm8k"}},
                {"dataset": {"name": "b", "path": "b.jsonl", "answer_kind": "gsm8k"}},
            ]
        },
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def test_machine_width_is_the_usable_cores_capped_by_omp_num_threads(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert machine_width() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a CI runner with two test workers
    assert machine_width() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # a cap above the cores leaves the cores
    assert machine_width() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "x")
    assert machine_width() == 4


def test_auto_gives_a_job_alone_every_core_and_splits_them_among_fan_out_workers(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    alone = config(tmp_path)
    assert job_threads(alone, "generate") == job_threads(alone, "eval") == 4
    fanned = config(tmp_path, generation={"workers": 3}, eval={"workers": 2})
    assert job_threads(fanned, "generate") == 1  # 4 // 3: never more threads than cores
    assert job_threads(fanned, "eval") == 2
    warm = config(tmp_path, orchestration={"execution": "warm"})
    assert job_threads(warm, "segment") == job_threads(warm, "eval") == 4  # one process: every core
    pinned = config(tmp_path, generation={"engine_kwargs": {"num_threads": 1}})
    assert job_threads(pinned, "generate") == 1
    pods = config(tmp_path, orchestration={"launcher": "kubernetes"})
    assert job_threads(pods, "generate") is None and "num_threads" not in engine_options(pods, "generate")


def test_job_specs_record_a_concrete_thread_count(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = config(tmp_path, generation={"engine_kwargs": {"num_threads": "auto", "batch_size": 32}})
    gen = GenerateSpec.from_config(cfg, 0, 0)
    assert gen.engine_kwargs == {"num_threads": 2, "batch_size": 32}
    assert EvalSpec.from_config(cfg, 0).engine_kwargs == {"num_threads": 2, "batch_size": 32}
    assert cfg.generation.engine_kwargs["num_threads"] == "auto"  # the config keeps auto; the spec is concrete


@pytest.mark.parametrize("bad", [0, -2, "all", 1.5, True])
def test_a_thread_count_is_auto_or_a_positive_integer(tmp_path, bad):
    with pytest.raises(ValueError, match="generation.engine_kwargs.num_threads must be 'auto' or an integer >= 1"):
        config(tmp_path, generation={"engine_kwargs": {"num_threads": bad}})
