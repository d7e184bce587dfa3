"""Where vLLM's IPC sockets go (mugrpo.engines.vllm_engine.ipc_sockets_folder), without vLLM: the folder and the
variable only. That a real engine puts its sockets there and removes them on close is checked in the vLLM tier
(tests/integration/test_vllm_engine.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from mugrpo.engines.vllm_engine import ipc_sockets_folder

VAR = "VLLM_RPC_BASE_PATH"


@pytest.fixture
def temp(monkeypatch):
    """A temp dir short enough for socket paths (pytest's tmp_path is too deep: see the last test), removed after."""
    short = Path(tempfile.mkdtemp(prefix="mv-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    monkeypatch.delenv(VAR, raising=False)
    yield short
    shutil.rmtree(short, ignore_errors=True)


def test_the_variable_names_a_scratch_folder_while_the_engine_starts_then_is_restored(temp):
    with ipc_sockets_folder() as folder:
        assert folder is not None and folder.parent == temp and folder.name.startswith("mugrpo-vllm-ipc-")
        assert os.environ[VAR] == str(folder) and folder.is_dir()
    assert VAR not in os.environ
    assert folder.is_dir()  # the engine owns it from here: VLLMEngine.close removes it


def test_a_failed_start_removes_the_folder(temp):
    with pytest.raises(RuntimeError, match="start failed"), ipc_sockets_folder() as folder:
        raise RuntimeError("start failed")
    assert not folder.exists() and VAR not in os.environ


def test_the_users_own_base_path_is_kept(temp, monkeypatch):
    monkeypatch.setenv(VAR, "/run/mine")
    with ipc_sockets_folder() as folder:
        assert folder is None and os.environ[VAR] == "/run/mine"
    assert os.environ[VAR] == "/run/mine" and list(temp.iterdir()) == []


def test_a_temp_dir_too_deep_for_unix_socket_paths_keeps_vllms_default(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.delenv(VAR, raising=False)
    with ipc_sockets_folder() as folder:
        assert folder is None and VAR not in os.environ
    assert list(deep.iterdir()) == []
