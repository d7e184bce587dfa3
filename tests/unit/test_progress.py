"""Job progress in logs: a few plain lines instead of bar frames when the output is not a terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console
from rich.progress import Progress

from mugrpo.common.progress import PlainProgress, job_progress, quiet_library_bars


def _piped_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, soft_wrap=True), out


def test_piped_output_gets_start_every_tenth_and_end_lines():
    console, out = _piped_console()
    with job_progress("train stage 0", "updates", "loss {task.fields[loss]:+.2f}", console) as bar:
        assert isinstance(bar, PlainProgress)
        task = bar.add_task("train", total=100, loss=0.0)
        for u in range(1, 101):
            bar.update(task, completed=u, loss=u / 100)
    lines = out.getvalue().splitlines()
    assert len(lines) == 11, lines  # 0%, 10%, ..., 100%
    assert lines[0].startswith("train stage 0: 0/100 updates (0%)  loss +0.00")
    assert lines[-1].startswith("train stage 0: 100/100 updates (100%)  loss +1.00")
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_resumed_progress_and_advance_count_from_where_they_start():
    console, out = _piped_console()
    with job_progress("generate stage 1", "prompts", "{task.fields[tps]:.0f} tok/s", console) as bar:
        task = bar.add_task("gen", total=8, tps=0.0)
        bar.update(task, completed=4)  # shards committed by an earlier attempt
        for _ in range(4):
            bar.update(task, advance=1, tps=120.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("generate stage 1: 0/8 prompts (0%)")
    assert lines[1].startswith("generate stage 1: 4/8 prompts (50%)")
    assert lines[-1].startswith("generate stage 1: 8/8 prompts (100%)  120 tok/s")
    assert len(lines) == 6


def test_a_terminal_gets_a_rich_bar():
    console = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(job_progress("train stage 0", "updates", "", console), Progress)


def test_library_bars_are_quiet_when_not_a_terminal(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    try:
        assert quiet_library_bars(io.StringIO()) is True
        assert os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


@pytest.mark.parametrize("first", ["", "huggingface_hub"])
def test_library_bars_are_quiet_when_imported_after_without_importing_them(first):
    """A process that never loads a model (the CLI's) does not import transformers to quiet it; a library imported
    afterwards (huggingface_hub first or not) starts with its bars off."""
    code = f"""
import io, os, sys
for k in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
    os.environ.pop(k, None)
if {first!r}:
    import {first or "os"}
from mugrpo.common.progress import quiet_library_bars
assert quiet_library_bars(io.StringIO()) is True
assert "transformers" not in sys.modules
from huggingface_hub.utils import are_progress_bars_disabled
from transformers.utils import logging as hf_logging
assert are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
print("quiet")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "quiet", out.stderr[-2000:]


def test_library_bars_stay_in_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert quiet_library_bars(Tty()) is False
    assert "TQDM_DISABLE" not in os.environ


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_progress_counts_tokens_rate_prompts_and_eta():
    from mugrpo.common.progress import TokenProgress

    clock = _Clock()
    progress = TokenProgress("generate stage 0", Console(file=io.StringIO()), clock=clock)
    assert progress.line() == "generate stage 0: starting  0s"
    clock.now += 5
    progress.begin_sampling(prompts_total=8, token_budget=8 * 4 * 100)  # 3,200 tokens at most
    clock.now += 10
    progress.add_tokens(400)
    # 40 tok/s; no prompt finished yet: the ETA is the remaining budget's bound, (3200 - 400) / 40 = 70 s
    assert progress.line() == "generate stage 0: 400 tokens (40.0 tok/s), 0/8 prompts, ETA <70s  15s"
    progress.shard_done(4)
    # 100 tokens per finished prompt: 800 expected, 400 left at 40 tok/s
    assert progress.line() == "generate stage 0: 400 tokens (40.0 tok/s), 4/8 prompts, ETA 10s  15s"


def test_token_progress_warns_once_per_stall_naming_the_shard_and_cause():
    from mugrpo.common.progress import TokenProgress

    clock = _Clock()
    progress = TokenProgress(
        "generate stage 2", Console(file=io.StringIO()), stall_s=60, cause=lambda: "bf16 emulated", clock=clock
    )
    progress.begin_sampling(prompts_total=4, token_budget=100)
    progress.begin_shard(3)
    clock.now += 59
    assert progress.stall_warning() is None
    clock.now += 2
    warning = progress.stall_warning()
    assert warning == "WARNING: generate stage 2: no token for 61s in shard 3; likely cause: bf16 emulated"
    clock.now += 10
    assert progress.stall_warning() is None  # once per stall_s
    progress.add_tokens(1)  # tokens flow again: no warning until the next 60 s of silence
    clock.now += 30
    assert progress.stall_warning() is None


def test_token_progress_prints_its_first_line_at_once_then_on_every_tick():
    import time

    from mugrpo.common.progress import TokenProgress

    out = io.StringIO()
    progress = TokenProgress("generate stage 0", Console(file=out, width=200), interval_s=0.05)
    with progress.start("loading the policy"):
        assert out.getvalue().startswith("generate stage 0: loading the policy")
        progress.begin_sampling(prompts_total=2, token_budget=10)
        progress.add_tokens(5)
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 4 and all(line.startswith("generate stage 0: ") for line in lines)
    assert "5 tokens" in lines[-1]


def test_a_non_streaming_engine_gets_longer_before_a_stall_warning():
    from mugrpo.common.progress import NON_STREAMING_STALL_FACTOR, TokenProgress

    clock = _Clock()
    progress = TokenProgress("generate stage 0", Console(file=io.StringIO()), stall_s=60, clock=clock)
    progress.streaming = False
    progress.begin_sampling(prompts_total=4, token_budget=100)
    clock.now += 61
    assert progress.stall_warning() is None
    clock.now += 60 * NON_STREAMING_STALL_FACTOR
    assert "no token for" in progress.stall_warning()
