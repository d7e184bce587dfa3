"""mugrpo.common.lazy: a module imported on its first attribute read, once, whichever thread reads first."""

from __future__ import annotations

import sys
import threading

import pytest

from mugrpo.common.lazy import LazyModule


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    """A module on sys.path whose import takes 0.3 s and counts its executions; its name is unique to the test."""
    name = f"lazy_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "import time\n"
        "import builtins\n"
        "builtins.lazy_probe_runs = getattr(builtins, 'lazy_probe_runs', 0) + 1\n"
        "time.sleep(0.3)\n"
        "VALUE = 42  # set last: a reader that got a half-run module would miss it\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "lazy_probe_runs", 0, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_the_module_is_imported_on_the_first_attribute_read_only(slow_module):
    import builtins

    lazy = LazyModule(slow_module)
    assert slow_module not in sys.modules and builtins.lazy_probe_runs == 0 and "not imported yet" in repr(lazy)
    assert lazy.VALUE == 42
    assert sys.modules[slow_module].VALUE == 42 and builtins.lazy_probe_runs == 1 and "(imported)" in repr(lazy)
    assert lazy.VALUE == 42 and builtins.lazy_probe_runs == 1


def test_threads_reading_first_at_once_all_get_the_whole_module(slow_module):
    import builtins

    lazy = LazyModule(slow_module)
    start = threading.Barrier(8)
    seen: list[object] = []

    def read() -> None:
        start.wait()
        seen.append(lazy.VALUE)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert seen == [42] * 8 and builtins.lazy_probe_runs == 1


def test_a_missing_module_fails_at_the_first_read_and_writes_are_refused(slow_module):
    missing = LazyModule("mugrpo_no_such_module_anywhere")  # constructing it imports nothing
    with pytest.raises(ModuleNotFoundError, match="mugrpo_no_such_module_anywhere"):
        _ = missing.anything
    with pytest.raises(AttributeError, match="on the module .* itself"):
        LazyModule(slow_module).VALUE = 1
    assert slow_module not in sys.modules  # the refused write imported nothing
