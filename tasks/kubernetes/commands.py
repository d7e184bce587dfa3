"""The command of a job's container: the init (tini), then the job as one process, one process per GPU
(``accelerate launch`` or ``torchrun``), or one node of a multi-node job (``torchrun`` with a static rendezvous)."""

from __future__ import annotations

from tasks.kubernetes.names import job_name
from tasks.kubernetes.settings import KubernetesJobSettings
from tasks.launchers.request import JobRequest

#: Env var of a multi-node pod holding its node rank (its Indexed Job completion index, through the downward API).
NODE_RANK_ENV = "MUGRPO_NODE_RANK"
#: Pod annotation the Job controller sets to the completion index of an Indexed Job's pod.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def job_nodes(kind: str, settings: KubernetesJobSettings) -> int:
    """Pods of a job kind: ``settings.nodes[kind]`` for a kind of ``multi_gpu_kinds``, else 1.

    Raises:
        ValueError: more than one node asked for a kind that is not data parallel.
    """
    nodes = settings.nodes.get(kind, 1)
    if nodes > 1 and kind not in settings.multi_gpu_kinds:
        raise ValueError(
            f"nodes[{kind!r}] = {nodes}: only the data-parallel kinds {settings.multi_gpu_kinds} run over several "
            "pods (generation scales out with generation.workers instead)"
        )
    return max(nodes, 1)


def multinode_command(
    python: str,
    module: str,
    spec_url: str,
    *,
    nodes: int,
    procs_per_node: int,
    node_rank: str,
    master_addr: str,
    master_port: int,
    extra: list[str] = (),
) -> list[str]:
    """``torchrun`` of one node of a multi-node job with a static rendezvous (no etcd, no elastic restarts:
    every node must be present, a lost node fails the attempt and Prefect retries it; the job resumes from its
    checkpoint): ``python -m torch.distributed.run --nnodes N --nproc_per_node P --node_rank R --rdzv_backend
    static --master_addr A --master_port PORT -m MODULE SPEC``. Node 0 hosts the rendezvous store at A:PORT.

    The Kubernetes launcher renders it with ``node_rank = $(MUGRPO_NODE_RANK)`` (expanded by the kubelet from the
    pod's completion index) and ``master_addr = {job}-0.{job}`` (pod 0's DNS name under the headless Service);
    the multi-node test runs it on 127.0.0.1 with two "nodes" of one CPU process each.
    """
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(procs_per_node),
        "--node_rank",
        node_rank,
        "--rdzv_backend",
        "static",
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        *extra,
        "-m",
        module,
        spec_url,
    ]


def job_command(request: JobRequest, settings: KubernetesJobSettings, name: str | None = None) -> list[str]:
    """The job container's command: the init (tini), then ``python -m MODULE SPEC``, or, for a kind in
    ``settings.multi_gpu_kinds`` given N > 1 GPUs, one process per GPU through ``accelerate launch`` (``python -m
    accelerate.commands.launch --multi_gpu --num_processes N --num_machines 1 -m MODULE SPEC``) or ``torchrun``
    (``python -m torch.distributed.run --standalone --nproc_per_node N -m MODULE SPEC``). The interpreter is the
    job's own (``request.python``), so the launcher runs from the same environment as the job. A kind run on
    N > 1 pods (``settings.nodes``) runs :func:`multinode_command` (one torchrun per pod, GPUS processes each) with
    pod 0 of Job ``name`` as the rendezvous."""
    python, gpus = request.python or "python", settings.gpus_for(request.kind)
    extra = list(settings.launcher_args.get(request.kind, []))
    nodes = job_nodes(request.kind, settings)
    if nodes > 1:
        name = name or job_name(request)
        run = multinode_command(
            python,
            request.module_name,
            request.spec_url,
            nodes=nodes,
            procs_per_node=max(gpus, 1),
            node_rank=f"$({NODE_RANK_ENV})",
            master_addr=f"{name}-0.{name}",
            master_port=settings.rendezvous_port,
            extra=extra,
        )
    elif gpus > 1 and request.kind in settings.multi_gpu_kinds:
        if settings.multi_gpu_launcher == "accelerate":
            launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(gpus)]
            launch += ["--num_machines", "1"]
        else:
            launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
        run = [python, *launch, *extra, "-m", request.module_name, request.spec_url]
    else:
        run = request.command(python)
    return [*settings.init_command, *run]
