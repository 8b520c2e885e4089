"""Two processes x two CPU devices under jax.distributed, on loopback."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("_multiprocess_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_two_devices_each():
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(port), "2", str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
    expected = np.arange(12, dtype=np.float32)[::-1]
    for pid, r in enumerate(results):
        assert r["initialized"] is True
        assert r["process_id"] == pid
        assert r["device_count"] == 4
        assert r["ranks"] == [2 * pid, 2 * pid + 1]
        assert r["pmax"] == 11.0 and r["pmin"] == 0.0
        np.testing.assert_array_equal(r["gathered"], expected)
        # each process holds its own half of the population, doubled
        np.testing.assert_array_equal(
            r["doubled_local"], sorted(2 * expected[6 * pid : 6 * pid + 6])
        )
