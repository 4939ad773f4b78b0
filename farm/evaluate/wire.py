"""Bytes between the evaluator and its runners: length-prefixed frames with a maximum size and a
deadline, and a plain-data codec for what a runner sends back.

A runner is untrusted, so nothing it sends is unpickled or handed to torch.load (a zip entry
in a 1 MB frame can inflate to gigabytes; a pickle can name any callable). A reply is a JSON
header (None, bools, numbers, strings, lists, dicts with string keys, and tensor references)
followed by the tensors' raw bytes. Each tensor's dtype, shape and byte count are checked
against each other and against the frame before a single byte is copied, so decoding never
allocates more than the frame the evaluator agreed to read.

Commands go the other way, from the evaluator to a runner that trusts it: pickled, and where
they carry 16 MiB of tensors or more, written with torch.save into an anonymous memory file
whose descriptor travels with the frame (SCM_RIGHTS): no path in the runner's folder is ever
written or read by the evaluator.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

_LEN = struct.Struct("!Q")
MAX_HEADER = 1 << 20  # JSON of a reply, tensors excluded
MAX_DEPTH = 32  # nesting of lists and dicts in a reply

DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int64", "int32", "int16",
          "int8", "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2")


class ProtocolError(Exception):
    """What a runner sent is not a frame of the protocol (too large, too slow, malformed)."""


class FrameTooLarge(ProtocolError):
    pass


class FrameTimeout(ProtocolError):
    pass


# ---------------------------------------------------------------- frames


def send_frame(sock: socket.socket, payload: bytes, fds: tuple[int, ...] = ()) -> None:
    data = _LEN.pack(len(payload)) + payload
    if fds:
        sent = sock.sendmsg([data[:8]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
        data = data[sent:]
    sock.sendall(data)


def recv_frame(sock: socket.socket, max_bytes: int, deadline: float, wait: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.monotonic) -> bytes:
    """One frame of at most `max_bytes`, complete before `deadline` (on `clock`); `wait()` runs
    between reads (a watchdog) and may raise. EOF raises EOFError; a frame announced larger than
    `max_bytes`, or not complete in time, raises ProtocolError without reading it."""
    head = _read_exact(sock, _LEN.size, deadline, wait, clock)
    (size,) = _LEN.unpack(head)
    if size > max_bytes:
        raise FrameTooLarge(f"a frame of {size} bytes was announced; at most {max_bytes} are accepted")
    return _read_exact(sock, size, deadline, wait, clock)


def recv_frame_fds(sock: socket.socket, max_fds: int = 1) -> tuple[bytes, list[int]]:
    """Runner side (it trusts the evaluator): one frame and the descriptors sent with it."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _LEN.size, max_fds)
    if not head:
        raise EOFError
    while len(head) < _LEN.size:
        more = sock.recv(_LEN.size - len(head))
        if not more:
            raise EOFError
        head += more
    (size,) = _LEN.unpack(head)
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 22))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks), fds


def _read_exact(sock: socket.socket, n: int, deadline: float, wait, clock) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        left = deadline - clock()
        if left <= 0:
            raise FrameTimeout(f"no complete frame in time ({got} of {n} bytes)")
        ready, _, _ = select.select([sock], [], [], min(left, 0.05))
        if not ready:
            if wait is not None:
                wait()
            continue
        try:
            k = sock.recv_into(view[got:], n - got)
        except (BlockingIOError, InterruptedError):
            continue
        if k == 0:
            raise EOFError
        got += k
    return bytes(buf)


# ---------------------------------------------------------------- replies: plain data


def encode(tree: Any) -> bytes:
    """Runner side: a tree of plain values and tensors as header + raw bytes."""
    import torch

    blobs: list[bytes] = []

    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            blobs.append(raw)
            return {"$t": len(blobs) - 1, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                    "nbytes": len(raw)}
        if isinstance(v, dict):
            return {"$d": [[str(k), walk(x)] for k, x in v.items()]}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return {"$repr": type(v).__name__}  # not plain data: named, never sent

    header = json.dumps(walk(tree), allow_nan=True).encode()
    return _LEN.pack(len(header)) + header + b"".join(blobs)


def decode(data: bytes) -> Any:
    """Evaluator side: the tree `encode` made, with every claim about a tensor checked before
    its bytes are copied. Raises ProtocolError on anything else."""
    if len(data) < _LEN.size:
        raise ProtocolError("a reply shorter than its header")
    (hsize,) = _LEN.unpack_from(data)
    if hsize > MAX_HEADER or _LEN.size + hsize > len(data):
        raise ProtocolError(f"a reply header of {hsize} bytes in a frame of {len(data)}")
    try:
        header = json.loads(data[_LEN.size:_LEN.size + hsize])
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a reply header that is not JSON: {type(exc).__name__}") from None
    body = memoryview(data)[_LEN.size + hsize:]
    offsets = _blob_offsets(header, len(body))
    return _build(header, body, offsets, 0)


def _blob_offsets(header: Any, body_len: int) -> dict[int, tuple[int, int]]:
    """Where each tensor's bytes lie, once the declared sizes add up to the body exactly."""
    refs: list[tuple[int, int]] = []

    def collect(v: Any, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ProtocolError(f"a reply nested deeper than {MAX_DEPTH}")
        if isinstance(v, list):
            for x in v:
                collect(x, depth + 1)
        elif isinstance(v, dict):
            if "$t" in v:
                refs.append((_int(v.get("$t")), _int(v.get("nbytes"))))
            elif "$d" in v:
                for pair in _pairs(v):
                    collect(pair[1], depth + 1)

    collect(header, 0)
    refs.sort()
    if [i for i, _ in refs] != list(range(len(refs))):
        raise ProtocolError("tensor references in a reply are not numbered 0..n-1 once each")
    out, at = {}, 0
    for i, n in refs:
        out[i] = (at, n)
        at += n
    if at != body_len:
        raise ProtocolError(f"a reply declares {at} bytes of tensors and carries {body_len}")
    return out


def _build(v: Any, body: memoryview, offsets: dict, depth: int) -> Any:
    if isinstance(v, list):
        return [_build(x, body, offsets, depth + 1) for x in v]
    if isinstance(v, dict):
        if "$t" in v:
            return _tensor(v, body, offsets)
        if "$d" in v:
            return {k: _build(x, body, offsets, depth + 1) for k, x in _pairs(v)}
        if "$repr" in v:
            raise ProtocolError(f"a reply holds a {str(v['$repr'])[:60]}, which is not plain data")
        raise ProtocolError("a reply holds an object the protocol does not know")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise ProtocolError(f"a reply holds a {type(v).__name__}")


def _tensor(v: dict, body: memoryview, offsets: dict):
    import torch

    dtype_name, shape = v.get("dtype"), v.get("shape")
    if dtype_name not in DTYPES or not hasattr(torch, dtype_name):
        raise ProtocolError(f"a reply holds a tensor of unknown dtype {str(dtype_name)[:40]!r}")
    if not isinstance(shape, list) or len(shape) > 16 or not all(isinstance(d, int) and not isinstance(d, bool)
                                                                  and 0 <= d for d in shape):
        raise ProtocolError(f"a reply holds a tensor of impossible shape {str(shape)[:80]}")
    dtype = getattr(torch, dtype_name)
    numel = 1
    for d in shape:
        numel *= d
    start, nbytes = offsets[v["$t"]]
    if numel * dtype.itemsize != nbytes:
        raise ProtocolError(f"a reply's tensor claims shape {shape} of {dtype_name} ({numel * dtype.itemsize} "
                            f"bytes) and carries {nbytes}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    raw = bytearray(body[start:start + nbytes])  # a copy the tensor owns
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def _pairs(v: dict) -> list:
    pairs = v.get("$d")
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                              for p in pairs):
        raise ProtocolError("a reply holds a malformed mapping")
    return pairs


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ProtocolError(f"a reply holds {str(v)[:40]!r} where a count belongs")
    return v


# ---------------------------------------------------------------- commands: trusted, to the runner


def memfile(write: Callable[[Any], None], name: str = "farm-message") -> int:
    """An anonymous memory file holding what `write(file)` wrote, rewound: its descriptor is
    sent to a runner instead of a path."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    with os.fdopen(os.dup(fd), "wb") as f:
        write(f)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
