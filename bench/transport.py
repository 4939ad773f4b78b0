"""How long a large input set takes to reach a candidate runner, by each of the two ways
farm.evaluate.runner can send it: pickled through the socket, or written by torch.save into
a file that the runner reads (what commands of FILE_MIN_BYTES or more use). A 256 MB set
(two bf16 and one fp32 tensor of 8192 x 4096, a training op's inputs); three repetitions of
each, after one not counted; one process pair, host only (no device).

    python bench/transport.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import statistics
import tempfile
import time

REPS = 4  # the first of each is not counted (page cache, allocator)


def _child(conn) -> None:
    import torch

    for _ in range(REPS):
        pickle.loads(conn.recv_bytes())
        conn.send("ok")
    for _ in range(REPS):
        name = conn.recv()
        torch.load(name, weights_only=False)
        os.unlink(name)
        conn.send("ok")


def main() -> None:
    import torch

    from farm.runtime.tensors import dumps, tensor_bytes

    x = torch.randn(8192, 4096).to(torch.bfloat16)
    msg = {"cmd": "put_inputs", "inputs": [x, x.clone(), torch.rand(8192, 4096)]}
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_child, args=(child,))
    proc.start()
    socket_s, file_s = [], []
    for _ in range(REPS):
        t = time.monotonic()
        parent.send_bytes(dumps(msg))
        parent.recv()
        socket_s.append(time.monotonic() - t)
    for _ in range(REPS):
        t = time.monotonic()
        fd, path = tempfile.mkstemp(suffix=".pt")
        with os.fdopen(fd, "wb") as f:
            torch.save(msg, f)
        parent.send(path)
        parent.recv()
        file_s.append(time.monotonic() - t)
    proc.join()
    mb = tensor_bytes(msg) / 2**20
    print(f"{mb:.0f} MiB input set, seconds until the runner holds it (median of {REPS - 1}):")
    print(f"  socket (pickle, send, unpickle): {statistics.median(socket_s[1:]):.2f}  {[round(s, 2) for s in socket_s]}")
    print(f"  file (torch.save, torch.load):   {statistics.median(file_s[1:]):.2f}  {[round(s, 2) for s in file_s]}")


if __name__ == "__main__":
    main()
