"""``mugrpo lab init``: build (or find in the cache) the lab policy and print where it is and how it scores."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from mugrpo.common.exit_codes import ExitCode

lab_app = typer.Typer(help="The lab: a small policy that learns a reasoning-gym task on a CPU.", no_args_is_help=True)
console = Console(soft_wrap=True)


@lab_app.command("init")
def init_cmd(
    task: str | None = typer.Option(None, help="reasoning-gym task (default: the lab's basic_arithmetic)."),
    params: str | None = typer.Option(None, help="Task params as JSON, e.g. '{\"max_digits\": 1}'."),
    seed: int = typer.Option(0, help="Seeds problems, initialization and SFT order."),
    target: float | None = typer.Option(None, help="Stop SFT at this sampled (T=1) held-out accuracy."),
    cache_dir: Path | None = typer.Option(
        None, help="Cache folder (default $MUGRPO_LAB_CACHE or ~/.cache/mugrpo/lab)."
    ),
    force: bool = typer.Option(False, help="Rebuild even if the recipe is cached."),
):
    """Build the lab policy for a recipe, once: a small Llama with a character-level tokenizer, SFT'd on the task's
    gold answers until its sampled held-out accuracy reaches the target. Prints the policy folder (use it as
    `model.source`, or `model.source: lab` for the default recipe)."""
    from mugrpo.data.gym import GymNotInstalled
    from mugrpo.lab import LAB_INFO, LabRecipe, ensure_lab_policy

    fields: dict = {"seed": seed}
    if task is not None:
        fields["task"] = task
    if params is not None:
        fields["params"] = json.loads(params)
    if target is not None:
        fields["target_accuracy"] = target
    try:
        recipe = LabRecipe(**fields)
        path = ensure_lab_policy(recipe, cache_root=cache_dir, force=force)
    except (GymNotInstalled, ValueError) as e:
        Console(stderr=True).print(f"Error: {e}", style="red", markup=False, highlight=False)
        raise typer.Exit(ExitCode.ASKED_WRONG) from None
    info = json.loads((path / LAB_INFO).read_text())
    held = info["heldout"]
    console.print(
        f"lab policy {info['hash']}: {info['parameters'] / 1e6:.2f} M parameters, {info['steps']} SFT steps in "
        f"{info['seconds']['total']:.0f} s; held-out ({held['greedy']['n']} problems) greedy "
        f"{held['greedy']['accuracy']:.3f}, T=1 {held['t1']['accuracy']:.3f}"
    )
    console.print(str(path))


def register_cli(app: typer.Typer) -> None:
    """Add ``mugrpo lab ...`` to the main command line."""
    app.add_typer(lab_app, name="lab")
