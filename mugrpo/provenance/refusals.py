"""Refusals: a run that cannot start or continue as asked (:mod:`mugrpo.orchestration.resume`,
:mod:`mugrpo.provenance.prompt_plan`)."""

from __future__ import annotations

from mugrpo.storage.store import ChecksumError


class RunRefused(RuntimeError):
    """A run cannot start or continue as asked. The message is one block naming what differs and the way out;
    nothing was written. The command line prints it once and exits 2."""


class InputChangedError(RunRefused, ChecksumError):
    """An input of the run (training set, eval set, initial weights, tokenizer) differs from its fingerprint in
    run.json, or is gone; the message names the file, both sha256 and the way out. A job that meets one exits 2
    without retries (:func:`mugrpo.jobs.common.refuse_untrusted` treats it as a tampered input)."""


def plural(items: list, noun: str) -> str:
    """``"1 input"``, ``"2 inputs"``."""
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
