"""The house rules of the code base, checked on the source (no run): algorithms have one home, every module sits in a
layer of the import contract, and the core path is written in functions that fit on a screen.

- Outside the algorithm packages (``mugrpo/algorithms/``), the loss registry (``mugrpo/losses/``) and the stored data
  contract (``schemas/``: column and table names written in every file so far), no module of the library, the flows
  or the tasks names an algorithm in code: no identifier, import or one-word string (a key, a column, a registry
  name) contains one. Prose (docstrings, comments, field descriptions) may cite the papers.
- Every top-level module and package of ``mugrpo`` is in a layer of the import-linter contract that ``make lint``
  checks (``.importlinter``), so a new module cannot skip the layering.
- No function of the trainer, the generation library, the flows or ``mugrpo.inspection.report.render`` is over 80 lines.
"""

from __future__ import annotations

import ast
import configparser
import io
import re
import tokenize
from pathlib import Path

import pytest

from mugrpo.algorithms import ALGORITHMS, section_fields
from mugrpo.config import Config
from mugrpo.generation import GenerateSpec
from mugrpo.losses import POLICY_LOSSES
from mugrpo.trainer.spec import TrainSpec

REPO = Path(__file__).resolve().parents[2]
#: Where code may name an algorithm.
HOMES = ("mugrpo/algorithms/", "mugrpo/losses/")
#: The baseline every algorithm is a variant of: its name is everywhere (mugrpo, the grpo estimator).
BASELINE = "grpo"
MAX_FUNCTION_LINES = 80
CORE_PATH = ("mugrpo/trainer", "mugrpo/generation", "flows")


def algorithm_names() -> list[str]:
    """Every registered algorithm and every registered loss but the baseline: a3po, agpo, conspo, geo_mask, gspo,
    icepop, m2po, mu_grpo, replay, seq_is, seq_snis (derived from the registries, so a new one is covered)."""
    return sorted((set(ALGORITHMS) | set(POLICY_LOSSES)) - {BASELINE})


def _components(text: str) -> list[str]:
    return [c for c in re.split(r"[_./=\-{}]+", text.lower()) if c]


def _names(text: str, names: list[str]) -> str | None:
    """The algorithm ``text`` names: one whose underscore-separated parts appear in a row among ``text``'s parts
    (``agpo_u`` names agpo, ``mu_grpo_loss`` names mu_grpo; ``replayed``, ``mugrpo`` name none)."""
    parts = _components(text)
    for name in names:
        want = name.split("_")
        if any(parts[i : i + len(want)] == want for i in range(len(parts) - len(want) + 1)):
            return name
    return None


def _string_body(token: str) -> str:
    m = re.match(r"^[rRbBuUfF]*(\"\"\"|'''|\"|')", token)
    if m is None:
        return token
    quote = m.group(1)
    return token[m.end() : -len(quote)] if token.endswith(quote) else token[m.end() :]


def code_mentions(source: str, names: list[str]) -> list[tuple[int, str, str]]:
    """(line, token, algorithm) of every identifier and one-word string literal of ``source`` naming an algorithm."""
    hits = []
    fstring_middle = getattr(tokenize, "FSTRING_MIDDLE", None)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            hit = _names(tok.string, names)
        elif tok.type in (tokenize.STRING, fstring_middle):
            body = _string_body(tok.string) if tok.type == tokenize.STRING else tok.string
            hit = _names(body, names) if re.fullmatch(r"[A-Za-z0-9_.\-/={}]+", body) else None
        else:
            continue
        if hit:
            hits.append((tok.start[0], tok.string, hit))
    return hits


def test_the_check_sees_what_it_must():
    names = ["agpo", "mu_grpo", "replay"]
    source = (
        '"""Docstrings may cite AGPO and replay."""\n'
        "from mugrpo.algorithms.replay import X  # comments may too\n"
        'if loss.name == "agpo":\n'
        "    row['agpo_u'] = mu_grpo_loss(f'{x}_replay_part')\n"
        "self.replayed = mugrpo\n"
        'raise ValueError("replay.enabled needs an agpo section")\n'
    )
    found = [(line, hit) for line, _, hit in code_mentions(source, names)]
    assert found == [(2, "replay"), (3, "agpo"), (4, "agpo"), (4, "mu_grpo"), (4, "replay")]


def test_no_module_outside_the_algorithm_homes_names_an_algorithm():
    names = algorithm_names()
    assert {"agpo", "conspo", "gspo", "mu_grpo", "replay"} <= set(names)
    assert {"seq_is", "seq_snis", "geo_mask", "icepop", "m2po", "a3po"} <= set(names)  # the stale-data corrections
    offenders = []
    for root in ("mugrpo", "flows", "tasks"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(HOMES):
                continue
            hits = code_mentions(path.read_text(), names)
            offenders += [f"{rel}:{line}: {tok!r} names {hit}" for line, tok, hit in hits]
    assert not offenders, "algorithm names outside their homes:\n" + "\n".join(offenders)


def test_the_algorithm_homes_do_name_them():  # the check is not vacuous: the homes are where the names live
    names = algorithm_names()
    sources = [p.read_text() for home in HOMES for p in (REPO / home).rglob("*.py")]
    named = {hit for source in sources for _, _, hit in code_mentions(source, names)}
    assert named == set(names)


def channel_names() -> list[str]:
    """Every declared rollout column (``Algorithm.columns``) and loss input (``Algorithm.inputs``, the rollout
    inputs of ``mugrpo.losses.inputs``): is_probe, agpo_u, clip_eps, positive, ..."""
    from mugrpo.losses.inputs import ROLLOUT_INPUTS

    columns = [c.name for name in ALGORITHMS for c in ALGORITHMS[name].columns]
    inputs = [i for name in ALGORITHMS for i in ALGORITHMS[name].inputs]
    return sorted({*columns, *inputs, *ROLLOUT_INPUTS})


def test_no_module_outside_the_algorithm_homes_names_a_declared_column_or_loss_input():
    """The per-rollout channel carries columns and inputs by name: code outside the homes reads them through it
    (``excluding_columns()``, ``LossContext.inputs``), never by a name of its own."""
    names = channel_names()
    assert {"is_probe", "agpo_u", "clip_eps", "positive"} <= set(names)
    offenders = []
    for root in ("mugrpo", "flows", "tasks"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(HOMES):
                offenders += [f"{rel}:{line}: {tok!r}" for line, tok, _ in code_mentions(path.read_text(), names)]
    assert not offenders, "declared columns or loss inputs named outside their homes:\n" + "\n".join(offenders)
    sources = [p.read_text() for home in HOMES for p in (REPO / home).rglob("*.py")]
    assert {hit for source in sources for _, _, hit in code_mentions(source, names)} == set(names)  # not vacuous


def test_config_and_specs_carry_each_algorithm_section():
    for name in ALGORITHMS:
        algorithm = ALGORITHMS[name]
        assert algorithm.name == name and name in Config.model_fields
        assert (name in TrainSpec.model_fields) == ("train" in algorithm.jobs)
        assert (name in GenerateSpec.model_fields) == ("generate" in algorithm.jobs)
    assert set(section_fields()) == set(ALGORITHMS)


def _contract_layers() -> list[set[str]]:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    (layers,) = [config[s]["layers"] for s in config.sections() if config[s].get("type") == "layers"]
    return [{m.strip() for m in re.split(r"[|:]", layer)} for layer in layers.split("\n") if layer.strip()]


def test_every_top_level_module_is_in_a_layer():
    listed = set().union(*_contract_layers())
    package = REPO / "mugrpo"
    modules = {f"mugrpo.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"mugrpo.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    modules |= {"flows", "tasks", "schemas"}
    assert not modules - listed, f"add to a layer in .importlinter: {sorted(modules - listed)}"
    assert not listed - modules, f"the contract lists modules that are gone: {sorted(listed - modules)}"


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


@pytest.mark.parametrize("root", CORE_PATH)
def test_core_path_functions_fit_on_a_screen(root):
    long = [f for path in sorted((REPO / root).rglob("*.py")) for f in _long_functions(path)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_report_render_fits_on_a_screen():
    assert not [f for f in _long_functions(REPO / "mugrpo" / "inspection" / "report" / "page.py") if " render " in f]


@pytest.fixture
def throwaway_loss():
    """A loss with its own knobs, registered as a plug-in would (``@POLICY_LOSSES.register`` and
    ``@loss_section``, nothing else), unregistered afterwards."""
    from pydantic import Field

    from mugrpo.losses import LOSS_SECTIONS, LossSection, loss_section

    @loss_section("throwaway")
    class ThrowawayConfig(LossSection):
        """The throwaway loss's own knobs (a test)."""

        temperature: float = Field(default=1.0, gt=0.0)
        """A knob."""

    POLICY_LOSSES.register("throwaway")(lambda *args, config, context=None: config.throwaway.temperature)
    yield ThrowawayConfig
    POLICY_LOSSES.unregister("throwaway")
    LOSS_SECTIONS.unregister("throwaway")


def test_adding_a_loss_touches_no_shared_file(throwaway_loss):
    """A loss's knobs live in its own section ``loss.<name>.*``, registered in its module: the shared loss config
    (mugrpo/losses/config.py) names no loss with a section and no such knob, and accepts a new loss's section."""
    from mugrpo.config import config_from_dict, load_config
    from mugrpo.config.docs import config_reference
    from mugrpo.config_keys import key_class
    from mugrpo.losses import LOSS_SECTIONS, PolicyLossConfig

    config = PolicyLossConfig.model_validate({"name": "throwaway", "throwaway": {"temperature": 0.5}})
    assert config.throwaway == throwaway_loss(temperature=0.5) and PolicyLossConfig().throwaway.temperature == 1.0
    with pytest.raises(ValueError, match="greater than 0"):
        PolicyLossConfig(throwaway={"temperature": 0.0})
    data = load_config("configs/gsm8k-smollm2.yaml").to_json_dict()
    data["loss"]["throwaway"] = {"temperature": 2.0}
    assert config_from_dict(data).loss.throwaway.temperature == 2.0  # the run config carries it too
    assert key_class("loss.throwaway.temperature", Config) == "semantic"
    assert "`loss.throwaway.temperature`" in config_reference()
    shared = (REPO / "mugrpo" / "losses" / "config.py").read_text()
    assert not code_mentions(shared, sorted(LOSS_SECTIONS))  # (its default name, mu_grpo, has no section)
    knobs = {k for name in LOSS_SECTIONS for k in LOSS_SECTIONS[name].model_fields}
    assert not knobs & set(PolicyLossConfig.model_fields)


def test_loss_sections_read_the_flat_keys_of_earlier_run_configs():
    """run.json files written before loss sections hold flat keys (loss.icepop_low); they still load, mapped. A YAML
    config or override with one is refused, naming the new key."""
    from mugrpo.config import ConfigError, load_config
    from mugrpo.losses import PolicyLossConfig

    with pytest.raises(ConfigError, match=r"loss.icepop_low is now loss.icepop.low; loss.positive_rule is now "
                       r"loss.conspo.positive_rule"):  # fmt: skip
        load_config("configs/gsm8k-smollm2.yaml", ["loss.icepop_low=0.3", "loss.positive_rule=correctness"])

    old = PolicyLossConfig.model_validate({"name": "icepop", "icepop_low": 0.3, "positive_rule": "reward_threshold",
                                           "positive_threshold": 0.5, "m2po_behavior_weight_cap": 4.0})  # fmt: skip
    assert (old.icepop.low, old.icepop.high, old.m2po.behavior_weight_cap) == (0.3, 2.0, 4.0)
    assert old.conspo.positive_threshold == 0.5
    assert PolicyLossConfig.model_validate(old.model_dump(mode="json")) == old
    with pytest.raises(ValueError, match="loss.icepop_lo is not a loss key"):
        PolicyLossConfig.model_validate({"icepop_lo": 0.3})


def test_loading_a_config_and_the_command_line_imports_no_torch():
    """The losses and the algorithms hold tensor code yet register their names, needs and sections at import, so
    their modules take torch lazily (:mod:`mugrpo.common.lazy`): a fresh interpreter that imports the command line,
    loads a config and resolves its precision (the pinned choice decides: no hardware probe) has not imported torch.
    A module-level ``import torch`` or a torch attribute read at import on that path fails this, naming the importer."""
    import os
    import subprocess
    import sys

    script = """
import builtins, sys, traceback
real_import = builtins.__import__
def watch(name, *args, **kwargs):
    if name.split(".")[0] == "torch" and "torch" not in sys.modules:
        sys.stderr.write("torch imported from:\\n" + "".join(traceback.format_stack(limit=6)[:-1]))
    return real_import(name, *args, **kwargs)
builtins.__import__ = watch
import mugrpo.cli.app
from mugrpo.config import load_config
from mugrpo.config.precision import resolve_precision
resolved = resolve_precision(load_config("configs/gsm8k-smollm2-quick.yaml"))
assert resolved.config.model.dtype == "float32" and resolved.record["hardware"] is None, resolved.record
sys.exit(3 if "torch" in sys.modules else 0)
"""
    env = {**os.environ, "MUGRPO_AUTO_PRECISION": "fp32"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=99)
    assert done.returncode == 0, done.stderr[-3000:]
