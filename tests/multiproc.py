"""Running tests/ddp_train.py under torchrun from a test, and reading back what each rank did.

Shared by tests/test_distributed.py (DDP) and tests/test_fsdp.py (FSDP2). Every launch runs in its own session with a
bounded timeout: a rank left waiting in a collective kills the launch and fails the test instead of hanging CI.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil  # an accelerate dependency
import pytest
from ddp_train import CASE_MARK, make_probes

SCRIPT = Path(__file__).with_name("ddp_train.py")
REPO = SCRIPT.parent.parent
TIMEOUT = 240


def assert_same(outcome, pred_index, margin, ref, what: str) -> None:
    np.testing.assert_array_equal(np.asarray(outcome), ref.outcome, err_msg=f"{what}: outcome")
    np.testing.assert_array_equal(np.asarray(pred_index), ref.pred_index, err_msg=f"{what}: pred_index")
    np.testing.assert_allclose(np.asarray(margin, dtype=np.float64), ref.margin.astype(np.float64), atol=1e-5, rtol=0,
                               equal_nan=True, err_msg=f"{what}: margin")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    """This process's environment for a child run, without the launcher's rank variables and without the ACCELERATE_*
    ones that transformers 4 leaves behind (any `TrainingArguments(bf16=True)` made by an earlier test sets
    ACCELERATE_MIXED_PRECISION=bf16 in os.environ, and a child Trainer would train in bf16 although told fp32).

    No GPU either: the child runs are CPU runs (gloo, `use_cpu`), and on a machine with fewer GPUs than ranks FSDP2's
    default mesh and accelerate still set the device cuda:<rank> ("invalid device ordinal", seen on a 1-GPU H200)."""
    ranks = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
    env = {k: v for k, v in os.environ.items() if k not in ranks and not k.startswith("ACCELERATE_")}
    return {**env, "CUDA_VISIBLE_DEVICES": ""}


def torchrun(out: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """Run tests/ddp_train.py under torchrun; on timeout kill the whole launch (its own session) and fail. Once more on
    another port if the port was taken between `free_port()` and the launch (`make test` runs two pytest workers, whose
    launches can overlap)."""
    run = _torchrun(out, *args, nproc=nproc)
    if run.returncode != 0 and PORT_TAKEN.search(run.stdout):  # at the rendezvous, before anything is written
        run = _torchrun(out, *args, nproc=nproc)
    return run


def torchrun_cases(root: Path, cases: dict[str, list[str]], nproc: int = 2) -> tuple[subprocess.CompletedProcess, dict[str, Path]]:
    """Several runs of tests/ddp_train.py in one torchrun launch, one after another (`--cases`): each case's arguments
    and its directory `root/<name>`. A launch (the processes, their imports, the rendezvous) costs more than a tiny
    model's training, so the tests of one module share launches where their runs can follow one another."""
    dirs = {name: root / name for name in cases}
    spec = json.dumps([[str(dirs[name]), *args] for name, args in cases.items()])
    return torchrun(root, "--cases", spec, nproc=nproc), dirs


def case_output(stdout: str, out: Path) -> str:
    """The part of a `torchrun_cases` launch's output that the case writing to `out` printed (each case starts with a
    marker line, printed once every rank finished the case before)."""
    parts = re.split(rf"^{re.escape(CASE_MARK)}(.*)$", stdout, flags=re.MULTILINE)
    return "".join(text for path, text in zip(parts[1::2], parts[2::2], strict=True) if path.strip() == str(out))


PORT_TAKEN = re.compile(r"address already in use|EADDRINUSE", re.IGNORECASE)


def _torchrun(out: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    port = free_port()
    env = clean_env()
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={port}", str(SCRIPT), str(out), *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # torchrun starts each worker in a session of its own: kill them by ancestry, then torchrun's session
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        pytest.fail(f"torchrun {' '.join(args)} did not finish in {TIMEOUT}s (a rank waiting in a collective?):\n{stdout[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, "")


def check_ok(run: subprocess.CompletedProcess) -> None:
    if run.returncode != 0:
        raise AssertionError(f"torchrun failed (exit {run.returncode}):\n{run.stdout[-6000:]}")


def trace(out: Path, rank: int) -> list[dict]:
    path = out / f"trace-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def assert_split(out: Path, calls: int, behavior: bool = False) -> None:
    """Each of the `calls` evaluations: both ranks scored an equal-sized shard, their probes disjoint, together all."""
    ids = make_probes(behavior).ids
    per_rank = [[r for r in trace(out, rank) if r["event"] == "score_probes"] for rank in range(2)]
    assert [len(c) for c in per_rank] == [calls, calls], "every rank scores at every evaluation"
    for c0, c1 in zip(*per_rank, strict=True):
        # 16 mcq + 2 short each, rank 1 padded (+ 2 behaviour probes each)
        assert c0["n"] == c1["n"] == -(-31 // 2) + -(-3 // 2) + (2 if behavior else 0)
        assert not set(c0["ids"]) & set(c1["ids"])
        assert set(c0["ids"]) | set(c1["ids"]) == set(ids)
