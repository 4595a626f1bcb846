"""Two CPU processes (torchrun, gloo): DATC, entropy_top (its quantile over both processes,
as TRL's) and random_top's checkpointed streams under TRL's data-parallel training."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_two_processes(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this python")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [
        torchrun,
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "-m",
        "tests.backends.trl.dist_worker",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its two workers
        output, _ = proc.communicate()
    assert proc.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    for rank in ranks:
        assert rank["world"] == 2 and rank["phase"] == "loss"
        assert len(rank["batches"]) == 2
        for batch in rank["batches"]:
            assert batch["rows"] == 6 and batch["zero_at_padding"] and batch["uneven"]
            assert batch["row_mean_err"] < 1e-4
    assert "credit/weight_max" in ranks[0]["metrics"]
    # the agreement of the whole step (3 groups of 4 over 2 x 6 rows, one straddling the
    # ranks), the same on both: SignalDirection's scores rank as TRL's reward does
    assert ranks[0]["agreement"] == ranks[1]["agreement"]
    assert [groups + skipped for _, groups, skipped in ranks[0]["agreement"]] == [3, 3]
    assert all(rho == 1.0 for rho, groups, _ in ranks[0]["agreement"] if groups)
    for rank in ranks:
        assert rank["entropy_top_is_trl"] == [True, True]
        assert rank["random_top_state"]
