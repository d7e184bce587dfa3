"""Config: YAML + dotted overrides; errors name the key, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from mugrpo.config import ConfigError, apply_overrides, load_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_overrides(tmp_path: Path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("run:\n  id: exp1\n  num_stages: 2\ntrain:\n  lr: 2.0e-5\n")
    cfg = load_config(cfg_file, ["train.lr=1e-6", "loss.veto_scope=sequence", "eval.benchmarks=[]"])
    assert cfg.run.id == "exp1" and cfg.run.num_stages == 2
    assert cfg.train.lr == pytest.approx(1e-6)
    assert cfg.loss.veto_scope == "sequence"


def test_bad_value_names_key_value_and_allowed(tmp_path: Path):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lr=abc"])
    assert "train.lr = 'abc'" in str(e.value) and "valid number" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["loss.veto_scope=everything"])
    msg = str(e.value)
    assert "loss.veto_scope = 'everything'" in msg and "'suffix'" in msg and "'sequence'" in msg
    with pytest.raises(ConfigError, match=r"train.updates_per_stage = 0: Input should be greater than or equal to 1"):
        load_config(None, ["train.updates_per_stage=0"])


def test_unknown_key_is_named(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"unknown key 'train.learning_rate'"):
        load_config(None, ["train.learning_rate=1e-5"])


def test_cross_field_check_and_bad_run_id():
    with pytest.raises(ConfigError, match="micro_batch_size"):
        load_config(None, ["train.micro_batch_size=16", "train.rollouts_per_update=8"])
    with pytest.raises(ConfigError, match=r"run.id = '\.\./x'"):
        load_config(None, ["run.id=../x"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="is not a section"):
        apply_overrides({"train": 3}, ["train.lr=1"])


def test_yaml_errors_name_the_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(lst)


def test_run_json_drops_credentials():
    cfg = load_config(None, ["run.storage_options={endpoint_url: 'http://x', secret: s3cr3t, key: AKIA}"])
    d = cfg.to_json_dict()
    assert d["run"]["storage_options"] == {"endpoint_url": "http://x"}


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_validate(name: str):
    load_config(REPO / "configs" / name)


def test_docs_config_reference_is_current():
    from mugrpo.config.docs import config_reference

    page = (REPO / "docs" / "config.md").read_text()
    assert config_reference().strip() in page, "docs/config.md is stale: regenerate it with `mugrpo config reference`"


def test_registry_names_are_checked_at_load():
    from mugrpo.losses import POLICY_LOSSES

    assert {"agpo", "conspo", "grpo", "gspo", "mu_grpo", "m2po", "a3po"} <= set(POLICY_LOSSES)
    with pytest.raises(
        ConfigError,
        match=r"override 'loss.name=mugrpo': unknown policy loss 'mugrpo' \(did you mean 'mu_grpo'\?\); "
        r"registered: " + ", ".join(POLICY_LOSSES) + "$",
    ):
        load_config(None, ["loss.name=mugrpo"])
    with pytest.raises(ConfigError, match=r"unknown lr schedule 'cosin' \(did you mean 'cosine'\?\)"):
        load_config(None, ["train.lr_schedule=cosin"])
    with pytest.raises(ConfigError, match=r"generation.engine 'vlm' is not a rollout engine"):
        load_config(None, ["generation.engine=vlm"])


def test_override_errors_name_the_override_and_suggest_a_key():
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "configs" / "gsm8k-smollm2-quick.yaml", ["train.lrr=2e-5", "trian.lr=1"])
    msg = str(e.value)
    assert "override 'train.lrr=2e-5': unknown key 'train.lrr'; did you mean 'train.lr'?" in msg
    assert "override 'trian.lr=1': unknown key 'trian'; did you mean 'train'?" in msg
