"""The model-config check's verdicts (mugrpo.provenance.fingerprint.model_config_verdict): a model folder this machine
has passed is not built again on the meta device by the next run's fingerprints (the check's transformers import was
1.2-1.7 s of CPU in every `mugrpo run`), while a changed config.json is checked again and a refusal is never kept."""

from __future__ import annotations

import json
import shutil

import pytest

from mugrpo.provenance import fingerprint
from mugrpo.provenance.fingerprint import ModelConfigMismatchError, model_config_verdict, model_fingerprints


@pytest.fixture
def checks(monkeypatch, tmp_path):
    """Each call of the real check, by folder; the machine's cache in ``tmp_path``."""
    monkeypatch.setenv("MUGRPO_CACHE", str(tmp_path / "cache"))
    calls = []
    real = fingerprint.check_model_config

    def counted(source, folder):
        calls.append(folder)
        return real(source, folder)

    monkeypatch.setattr(fingerprint, "check_model_config", counted)
    return calls


def test_a_passed_folder_is_checked_once_per_machine(tiny_model_dir, tmp_path, checks):
    first = model_fingerprints(str(tiny_model_dir))
    verdict = model_config_verdict(first[0].sha256)
    assert checks == [tiny_model_dir] and verdict.is_file()
    assert verdict.parent.parent == tmp_path / "cache"

    # a new run of the same weights (no previous fingerprints), even from a copy elsewhere: no model build
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    again = model_fingerprints(str(copy))
    assert [fp.sha256 for fp in again] == [fp.sha256 for fp in first]
    assert checks == [tiny_model_dir]


def test_a_changed_config_is_checked_again_and_a_refusal_is_not_kept(tiny_model_dir, tmp_path, checks):
    model_fingerprints(str(tiny_model_dir))
    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (broken / "config.json").write_text(json.dumps(config))
    for _ in range(2):  # refused each time: nothing records it as passed
        with pytest.raises(ModelConfigMismatchError, match="builds 3 layers, the weights hold 2"):
            model_fingerprints(str(broken))
    assert checks == [tiny_model_dir, broken, broken]
    assert len(list((tmp_path / "cache" / "model-checks").iterdir())) == 1


def test_the_verdict_follows_the_weights_digest_and_the_transformers_version(monkeypatch):
    assert model_config_verdict("a" * 64) == model_config_verdict("a" * 64) != model_config_verdict("b" * 64)
    before = model_config_verdict("a" * 64)
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0.0.0-other")
    assert model_config_verdict("a" * 64) != before


def test_a_read_only_cache_only_costs_the_check(tiny_model_dir, tmp_path, monkeypatch, checks):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MUGRPO_CACHE", str(blocker))  # model-checks/ cannot be made under a file
    model_fingerprints(str(tiny_model_dir))
    model_fingerprints(str(tiny_model_dir))
    assert checks == [tiny_model_dir, tiny_model_dir]
