"""Multi-node training through the launcher's multi-node command (tasks.kubernetes.commands.multinode_command): two
torchrun "nodes" of one CPU process each (gloo), static rendezvous on 127.0.0.1, give the policy one process gives.

This is the command each pod of a multi-node Kubernetes Job runs, with the node rank and the rendezvous address
that the Indexed Job and its headless Service provide on a cluster (no cluster exists here).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
from _prefect import free_port
from _tiny import REPO_ROOT, job_env, policy_weights, train_spec, write_spec

from bench.support.synthetic import commit_synthetic_stage
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from tasks.kubernetes.commands import multinode_command

RUN = "trainer-test"


def test_two_nodes_of_one_process_give_the_policy_of_one_process(tiny_model_dir, tmp_path):
    commit_synthetic_stage(Store(str(tmp_path / "one")), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=1)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    env = job_env(ACCELERATE_USE_CPU="true")
    one_spec = write_spec(train_spec(tmp_path / "one", RUN, train={"micro_batch_size": 2}), tmp_path / "one.spec.json")
    proc = subprocess.run(
        [sys.executable, "-m", "mugrpo.jobs.train", str(one_spec)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    two_spec = write_spec(train_spec(tmp_path / "two", RUN, train={"micro_batch_size": 2}), tmp_path / "two.spec.json")
    port = free_port()
    nodes = [
        subprocess.Popen(
            multinode_command(
                sys.executable,
                "mugrpo.jobs.train",
                str(two_spec),
                nodes=2,
                procs_per_node=1,
                node_rank=str(rank),
                master_addr="127.0.0.1",
                master_port=port,
            ),
            env=env,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [n.communicate(timeout=600)[0] for n in nodes]
    for rank, (n, out) in enumerate(zip(nodes, outs, strict=True)):
        assert n.returncode == 0, f"node {rank}:\n{out[-3000:]}"
    assert "2 processes, MULTI_CPU, on cpu" in outs[0]

    layout = RunLayout(RUN)
    w0 = policy_weights(Store(str(tmp_path / "one")), layout.policy_dir(0))
    one = policy_weights(Store(str(tmp_path / "one")), layout.policy_dir(1))
    two = policy_weights(Store(str(tmp_path / "two")), layout.policy_dir(1))
    assert max((one[n] - w0[n]).abs().max().item() for n in w0) > 1e-3  # the weights did move
    for name in w0:
        torch.testing.assert_close(two[name], one[name], atol=2e-5, rtol=0)


@pytest.mark.parametrize("rank", ["0", "$(MUGRPO_NODE_RANK)"])
def test_the_multi_node_command_is_torchrun_with_a_static_rendezvous(rank):
    cmd = multinode_command(
        "py", "mugrpo.jobs.train", "s", nodes=4, procs_per_node=8, node_rank=rank, master_addr="a", master_port=1
    )
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--node_rank") + 1] == rank and cmd[cmd.index("--rdzv_backend") + 1] == "static"
    assert cmd[-3:] == ["-m", "mugrpo.jobs.train", "s"]
