"""Resume cannot silently change what a run trains on: run.json fingerprints every input a run reads
(training set, eval sets, the initial policy's weights and tokenizer); a resume with a changed or missing input,
or a changed semantic config key, is refused before anything is written, in one block printed once with exit
code 2; operational changes are accepted and recorded in run.json's history.

Real files, the real tiny policy folder (SmolLM2 tokenizer), real `init_run` (which converts policy 0) and the real
`mugrpo` command line in a subprocess. No Prefect run starts here: the command line refuses before it starts one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mugrpo.config import config_from_dict
from mugrpo.data.datasets import DatasetConfig
from mugrpo.orchestration.resume import ConfigMismatchError, InputChangedError, check_resume, resume_config
from mugrpo.orchestration.runs import init_run, load_run_config, open_store
from mugrpo.provenance.fingerprint import FileStamp, dataset_fingerprint, problems_digest, stamp_file

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
REPO = Path(__file__).resolve().parents[2]
RUN = "fp"

pytestmark = pytest.mark.usefixtures("shared_data_dir")


def lines(path: Path, n: int) -> list[str]:
    with path.open() as f:
        return [next(f) for _ in range(n)]


@pytest.fixture
def inputs(tmp_path: Path, tiny_model_dir: Path) -> dict[str, Path]:
    """Copies of every input, so a test can edit them: 40 GSM8K training rows, 6 test rows, the tiny policy."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(lines(DATA / "gsm8k/train.jsonl", 40)))
    (data / "test.jsonl").write_text("".join(lines(DATA / "gsm8k/test.jsonl", 6)))
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    return {"train": data / "train.jsonl", "eval": data / "test.jsonl", "model": model, "root": tmp_path / "runs"}


def config(inputs: dict[str, Path], **sections) -> dict:
    cfg = {
        "run": {"id": RUN, "root": str(inputs["root"]), "seed": 5, "num_stages": 2},
        "model": {"source": str(inputs["model"]), "max_context": 512},
        "data": {"train": {"name": "gsm8k", "path": str(inputs["train"]), "answer_kind": "gsm8k"}},
        "generation": {"prompts_per_stage": 4, "shard_size": 2, "sampling": {"max_new_tokens": 6, "n": 2}},
        "train": {"updates_per_stage": 2, "rollouts_per_update": 4, "micro_batch_size": 2},
        "eval": {
            "benchmarks": [
                {"dataset": {"name": "gsm8k", "path": str(inputs["eval"]), "answer_kind": "gsm8k"}, "num_prompts": 2}
            ]
        },
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def run_json(inputs) -> dict:
    return json.loads((inputs["root"] / RUN / "run.json").read_text())


def mugrpo(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}  # nothing listens: Prefect must not start
    return subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


# -------------------------------------------------------------------------------------------------- fingerprints


def test_a_new_run_records_every_input(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    doc = run_json(inputs)
    roles = doc["inputs"]
    assert sorted(roles) == ["data.train", "eval.gsm8k", "model.tokenizer", "model.weights"]
    train = roles["data.train"]
    assert train["kind"] == "file" and train["files"][0]["path"] == str(inputs["train"])
    assert train["sha256"] == stamp_file(str(inputs["train"])).sha256
    assert train["files"][0]["bytes"] == inputs["train"].stat().st_size
    assert train["recipe"]["path"] == str(inputs["train"]) and train["recipe"]["answer_kind"] == "gsm8k"
    weights = {Path(f["path"]).name for f in roles["model.weights"]["files"]}
    tokenizer = {Path(f["path"]).name for f in roles["model.tokenizer"]["files"]}
    assert {"model.safetensors", "config.json"} <= weights and "tokenizer.json" in tokenizer
    assert not weights & tokenizer
    assert doc["history"] == [
        {"event": "start", "at": doc["created_at"], "stage": 0, "code_version": doc["code_version"]}
    ]


def test_size_and_mtime_never_decide_that_a_file_is_unchanged(tmp_path):
    """A same-size edit with its mtime set back is caught: every check reads every byte."""
    f = tmp_path / "a.jsonl"
    f.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    first = stamp_file(str(f))
    st = f.stat()
    f.write_text('{"question": "1+1?", "answer": "#### 3"}\n')
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = stamp_file(str(f), first)
    assert (again.bytes, again.mtime_ns) == (first.bytes, first.mtime_ns) and again.sha256 != first.sha256
    f.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    assert stamp_file(str(f), again).sha256 == first.sha256


def test_a_generated_dataset_is_fingerprinted_by_its_recipe_and_its_problems():
    """A reasoning-gym source has no file: its fingerprint is its recipe plus a digest of the problems it yields,
    so a changed generator is caught even when the recipe is the same."""
    pytest.importorskip("reasoning_gym")  # the `gym` extra (make install includes it)
    from mugrpo.data.datasets import load_problems

    ds = DatasetConfig(source="reasoning_gym", task="basic_arithmetic", size=12, seed=3)
    fp = dataset_fingerprint(ds, "data.train")
    assert fp.kind == "generated" and not fp.files
    assert fp.recipe["source"] == "reasoning_gym" and fp.recipe["size"] == 12
    assert fp.sha256 == problems_digest(load_problems(ds)[0])
    assert dataset_fingerprint(ds, "data.train", fp).sha256 == fp.sha256  # regenerated: same problems, same digest
    other = DatasetConfig(source="reasoning_gym", task="basic_arithmetic", size=12, seed=4)
    assert dataset_fingerprint(other, "data.train").sha256 != fp.sha256  # other problems: another digest


# ------------------------------------------------------------------------------------------------------- refusals


def refused(cfg, *needles: str) -> str:
    with pytest.raises(InputChangedError) as e:
        check_resume(open_store(cfg), cfg)
    message = str(e.value)
    for needle in needles:
        assert needle in message, message
    return message


@pytest.mark.parametrize("which", ["train", "eval"])
def test_resume_refuses_a_changed_dataset_naming_it(inputs, which):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    path = inputs[which]
    recorded = stamp_file(str(path)).sha256
    path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))  # `tac`: same rows, reversed
    role = "data.train" if which == "train" else "eval.gsm8k"
    message = refused(
        cfg, role, str(path), f"recorded sha256 {recorded}", f"current  sha256 {stamp_file(str(path)).sha256}"
    )
    assert "Restore the input" in message and "new run with another run.id" in message
    before = run_json(inputs)
    with pytest.raises(InputChangedError):
        init_run(cfg)
    assert run_json(inputs) == before  # nothing written


def test_resume_refuses_changed_initial_weights_or_tokenizer(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    weights = inputs["model"] / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 0x01]))  # one float of the last tensor changed
    refused(cfg, "model.weights:", str(inputs["model"]), "model.safetensors")
    weights.write_bytes(original)
    check_resume(open_store(cfg), cfg)  # restored: accepted (re-hashed, same sha256)

    tok = inputs["model"] / "tokenizer_config.json"
    doc = json.loads(tok.read_text())
    doc["chat_template"] = "{{ messages[0]['content'] }}"
    tok.write_text(json.dumps(doc))
    message = refused(cfg, "model.tokenizer:", "tokenizer_config.json")
    assert "model.weights" not in message


def test_resume_refuses_a_missing_input_and_names_it(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    inputs["eval"].unlink()
    refused(cfg, "missing", str(inputs["eval"]))


def test_a_touched_unchanged_input_is_accepted_and_its_new_mtime_recorded(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    st = inputs["train"].stat()
    os.utime(inputs["train"], ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    init_run(cfg)
    doc = run_json(inputs)
    assert doc["inputs"]["data.train"]["files"][0]["mtime_ns"] == st.st_mtime_ns + 5 * 10**9
    assert [e["event"] for e in doc["history"]] == ["start", "resume"]
    assert "changes" not in doc["history"][1]


def test_a_run_started_before_fingerprints_gets_them_at_its_next_resume(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    path = inputs["root"] / RUN / "run.json"
    doc = json.loads(path.read_text())
    old = {k: doc[k] for k in ("run_id", "created_at", "code_version", "config")}  # what older versions wrote
    path.write_text(json.dumps(old))
    init_run(cfg)
    doc = run_json(inputs)
    assert sorted(doc["inputs"]) == ["data.train", "eval.gsm8k", "model.tokenizer", "model.weights"]
    assert doc["history"][0]["event"] == "resume" and doc["history"][0]["inputs_recorded"] is True


# --------------------------------------------------------------------------------------------------- config keys


def test_operational_changes_are_recorded_with_the_stage_they_take_effect(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    store = open_store(cfg)
    store.write_json(f"{RUN}/stages/stage=0.json", {"placeholder": True})  # stage 0 committed: changes start at 1
    stored = load_run_config(str(inputs["root"]), RUN)
    resumed = resume_config(stored, ["generation.workers=2", "orchestration.retries=3"], "runs/fp")
    assert resumed.generation.workers == 2 and resumed.orchestration.retries == 3
    init_run(resumed)
    doc = run_json(inputs)
    assert doc["config"]["generation"]["workers"] == 2  # the run continues with it from now on
    event = doc["history"][-1]
    assert event["event"] == "resume" and event["stage"] == 1
    assert event["changes"] == [
        {"key": "generation.workers", "from": 1, "to": 2, "class": "operational"},
        {"key": "orchestration.retries", "from": 1, "to": 3, "class": "operational"},
    ]


def test_a_semantic_override_is_refused_listing_each_key_by_class(inputs):
    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    stored = load_run_config(str(inputs["root"]), RUN)
    with pytest.raises(ConfigMismatchError) as e:
        resume_config(stored, ["generation.workers=2", "train.lr=5e-5", "run.seed=6"], "runs/fp")
    message = str(e.value)
    assert "2 semantic overrides" in message
    semantic, operational = message.split("operational (")
    assert "train.lr: 1e-05 -> 5e-05" in semantic and "run.seed: 5 -> 6" in semantic
    assert "generation.workers: 1 -> 2" in operational


# -------------------------------------------------------------------------------------------- the command line


def test_the_command_line_refuses_once_with_exit_2(inputs):
    """A refused resume prints one block once (no Prefect traceback, no repeats) and exits 2, for a changed
    input (`mugrpo resume`), a semantic override (`mugrpo resume RUN key=value`) and a changed config
    (`mugrpo run CONFIG`)."""
    import yaml

    cfg = config_from_dict(config(inputs))
    init_run(cfg)
    run_dir = str(inputs["root"] / RUN)

    out = mugrpo("resume", run_dir, "train.lr=5e-5", "generation.workers=2")
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert text.count("cannot resume run 'fp'") == 1 and "Traceback" not in text
    assert "train.lr: 1e-05 -> 5e-05" in text and "generation.workers: 1 -> 2" in text

    out = mugrpo("resume", run_dir, "train.no_such_knob=1")
    assert out.returncode == 2 and "unknown key 'train.no_such_knob'" in out.stderr, out.stderr

    changed = tmp_yaml = inputs["root"].parent / "changed.yaml"
    tmp_yaml.write_text(yaml.safe_dump(config(inputs, train={"lr": 5e-5})))
    out = mugrpo("run", str(changed))
    text = out.stdout + out.stderr
    assert out.returncode == 2 and text.count("cannot continue with this config") == 1, text
    assert "Traceback" not in text and "train.lr: 1e-05 -> 5e-05" in text

    inputs["train"].write_text("".join(reversed(inputs["train"].read_text().splitlines(keepends=True))))
    out = mugrpo("resume", run_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert text.count("changed since the run started") == 1 and "Traceback" not in text
    assert f"data.train: {inputs['train']}" in text


def test_a_sharded_model_folder_passes_the_weights_check_and_a_truncated_shard_does_not(tmp_path):
    import json

    import torch
    from safetensors.torch import save_file

    from mugrpo.provenance.fingerprint import BrokenModelError, check_model_folder

    save_file({"a": torch.zeros(4, 4)}, str(tmp_path / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({"b": torch.ones(8)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    check_model_folder("m", tmp_path)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(BrokenModelError, match="model-00002-of-00002.safetensors is not a complete safetensors file"):
        check_model_folder("m", tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(BrokenModelError, match="model.safetensors.index.json is not a safetensors index"):
        check_model_folder("m", tmp_path)
