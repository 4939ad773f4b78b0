"""S3Store against a real S3-compatible HTTP server (moto in a subprocess), through boto3."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from farm.errors import IntegrityError, InvalidName, StorageError
from farm.storage import open_store
from farm.storage.s3 import S3Store
from tests.s3_server import atomic_s3, flaky_proxy, s3_server  # noqa: F401

MB = 1024 * 1024


def _file(path, size: int, seed: int = 0):
    """A file of `size` pseudo-random bytes, written in chunks."""
    block = hashlib.sha256(str(seed).encode()).digest() * (MB // 32)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
            block = block[1:] + block[:1]  # no two blocks alike, so a misplaced part is caught
    return path


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trip_file(s3_server, tmp_path):  # noqa: F811
    store = s3_server.store("team/a")
    src = _file(tmp_path / "src.pt", 300_000)
    info = store.put_file("refs/mini/scale2.pt", src)
    assert info.sha256 == _sha(src) and info.size == 300_000

    raw = s3_server.client().head_object(Bucket=s3_server.bucket, Key="team/a/refs/mini/scale2.pt")
    assert raw["Metadata"]["sha256"] == _sha(src)

    dest = tmp_path / "out" / "scale2.pt"
    got = store.get_file("refs/mini/scale2.pt", dest)
    assert dest.read_bytes() == src.read_bytes() and got.sha256 == info.sha256
    assert not [p for p in dest.parent.iterdir() if p.name != "scale2.pt"]  # no temporary left behind
    assert store.head("refs/mini/scale2.pt") == info
    assert store.head("refs/mini/none.pt") is None
    assert store.verify("refs/mini/scale2.pt") == info.sha256
    assert store.url == f"s3://{s3_server.bucket}/team/a"


def test_put_file_checks_given_sha256(s3_server, tmp_path):  # noqa: F811
    store = s3_server.store()
    src = _file(tmp_path / "src.pt", 1000)
    with pytest.raises(IntegrityError):
        store.put_file("x.pt", src, sha256="0" * 64)
    assert store.head("x.pt") is None
    assert store.put_file("x.pt", src, sha256=_sha(src)).sha256 == _sha(src)


def test_multipart_upload_and_download(s3_server, tmp_path):  # noqa: F811
    store = s3_server.store(multipart_threshold_mb=5, multipart_chunksize_mb=5)
    src = _file(tmp_path / "big.pt", 12 * MB + 123, seed=1)
    store.put_file("refs/big/op.pt", src)

    raw = s3_server.client().head_object(Bucket=s3_server.bucket, Key="farm/refs/big/op.pt")
    assert raw["ETag"].strip('"').endswith("-3")  # 5 + 5 + 2 MB parts: a multipart object
    assert raw["Metadata"]["sha256"] == _sha(src)

    dest = tmp_path / "big.out"
    store.get_file("refs/big/op.pt", dest)
    assert _sha(dest) == _sha(src)


def test_bytes_list_delete(s3_server, tmp_path):  # noqa: F811
    store = s3_server.store("p")
    other = s3_server.store("q")
    store.put_bytes("refs/manifest.json", b'{"a": 1}\n')
    store.put_bytes("refs/mini/op1.pt", b"one")
    store.put_bytes("runs/r1/result.json", b"{}")
    other.put_bytes("refs/mini/op9.pt", b"nine")
    assert store.get_bytes("refs/mini/op1.pt") == b"one"
    assert store.read_json("refs/manifest.json") == {"a": 1}

    assert sorted(i.key for i in store.list()) == ["refs/manifest.json", "refs/mini/op1.pt", "runs/r1/result.json"]
    listed = list(store.list("refs/mini/"))
    assert [(i.key, i.size, i.sha256) for i in listed] == [("refs/mini/op1.pt", 3, None)]

    store.delete("refs/mini/op1.pt")
    assert not store.exists("refs/mini/op1.pt")
    assert other.exists("refs/mini/op9.pt")
    with pytest.raises(StorageError, match="no object"):
        store.get_bytes("refs/mini/op1.pt")
    with pytest.raises(StorageError, match=r"no object"):
        store.get_file("refs/mini/op1.pt", tmp_path / "never")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../b", "a//b", ".hidden/x", ""])
def test_key_validation(s3_server, key, tmp_path):  # noqa: F811
    store = s3_server.store()
    with pytest.raises(InvalidName):
        store.put_bytes(key, b"x")
    with pytest.raises(InvalidName):
        store.get_file(key, tmp_path / "d")
    with pytest.raises(InvalidName):
        store.head(key)


def test_open_store_url(s3_server, monkeypatch):  # noqa: F811
    from farm.config import Settings

    store = open_store(f"s3://{s3_server.bucket}/pre/fix", Settings(s3=s3_server.settings()))
    assert isinstance(store.inner, S3Store) and store.prefix == "pre/fix"
    store.put_bytes("k.json", b"{}")
    assert s3_server.client().head_object(Bucket=s3_server.bucket, Key="pre/fix/k.json")


def _add(name: str):
    def mutate(doc: dict) -> dict:
        doc.setdefault("entries", {})[name] = {"by": name}
        return doc

    return mutate


def test_conditional_writes_concurrent_updates(atomic_s3):  # noqa: F811
    store = atomic_s3.store()
    assert store.conditional_writes() is True  # moto honours If-None-Match / If-Match
    assert list(store.list()) == []  # the probe object is gone (and would be hidden anyway)

    def one(i: int) -> None:
        # a store per writer, like separate processes; each probes once
        atomic_s3.store().update_json("refs/manifest.json", _add(f"w{i}"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))
    doc = store.read_json("refs/manifest.json")
    assert sorted(doc["entries"]) == [f"w{i}" for i in range(8)]


def test_of_writers_holding_the_same_etag_exactly_one_lands(atomic_s3):  # noqa: F811
    """What the compare-and-swap stands on, as S3 decides it: of many PUTs If-Match the same
    ETag, one lands and the others get 412, every round (moto alone can let two land)."""
    from botocore.exceptions import ClientError

    client = atomic_s3.server.client(atomic_s3.endpoint)
    for round_ in range(3):
        key = f"cas/{round_}.json"
        etag = client.put_object(Bucket=atomic_s3.bucket, Key=key, Body=b"{}")["ETag"]
        barrier = threading.Barrier(8)

        def write(i: int, key: str = key, etag: str = etag, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            try:
                client.put_object(Bucket=atomic_s3.bucket, Key=key, Body=f'{{"w": {i}}}'.encode(), IfMatch=etag)
                return True
            except ClientError as exc:
                assert exc.response["Error"]["Code"] in ("PreconditionFailed", "412", "ConditionalRequestConflict")
                return False

        with ThreadPoolExecutor(8) as pool:
            landed = list(pool.map(write, range(8)))
        assert sum(landed) == 1, landed


def test_probe_detects_ignored_conditions_and_falls_back(s3_server, flaky_proxy, monkeypatch):  # noqa: F811
    from farm.reference import manifest

    monkeypatch.setattr("farm.storage.s3.SETTLE_S", (0.01, 0.02))
    flaky_proxy.ignore_conditions = True  # a server that silently drops If-Match / If-None-Match
    store = s3_server.store(endpoint_url=flaky_proxy.endpoint)
    assert store.conditional_writes() is False
    for name in ("a", "b"):
        assert name in store.update_json("m.json", _add(name))["entries"]
    assert sorted(store.read_json("m.json")["entries"]) == ["a", "b"]
    # The manifest's merge is not idempotent (it stamps updated_at): the fallback must still end.
    manifest.record(store, [{"source": "mini", "op_name": "scale2", "success": True}])
    assert list(manifest.entries(store)) == ["mini/scale2"]


def test_update_json_retries_conflicts_then_gives_up(s3_server, flaky_proxy, monkeypatch):  # noqa: F811
    store = s3_server.store(endpoint_url=flaky_proxy.endpoint)
    assert store.conditional_writes()
    flaky_proxy.fail_next(2, 412, "PreconditionFailed", method="PUT")
    store.update_json("m.json", _add("a"))
    flaky_proxy.fail_next(1, 409, "ConditionalRequestConflict", method="PUT")
    assert sorted(store.update_json("m.json", _add("b"))["entries"]) == ["a", "b"]

    monkeypatch.setattr("farm.storage.s3.UPDATE_ATTEMPTS", 3)
    flaky_proxy.fail_next(3, 412, "PreconditionFailed", method="PUT")
    with pytest.raises(StorageError, match=r"m\.json: update gave up after 3 attempts"):
        store.update_json("m.json", _add("c"))
    assert sorted(store.read_json("m.json")["entries"]) == ["a", "b"]


def test_corrupted_object_is_refused(s3_server, tmp_path):  # noqa: F811
    store = s3_server.store()
    src = _file(tmp_path / "src.pt", 100_000)
    store.put_file("refs/mini/op.pt", src)
    client = s3_server.client()
    # Replace the bytes behind the store's back, keeping the old sha256 metadata.
    client.put_object(
        Bucket=s3_server.bucket, Key="farm/refs/mini/op.pt", Body=b"tampered" * 100, Metadata={"sha256": _sha(src)}
    )
    dest = tmp_path / "dest.pt"
    with pytest.raises(IntegrityError, match=r"refs/mini/op\.pt"):
        store.get_file("refs/mini/op.pt", dest)
    assert not dest.exists()
    assert os.listdir(tmp_path) == ["src.pt"]  # no temporary file left either
    with pytest.raises(IntegrityError, match=f"s3://{s3_server.bucket}/farm/refs/mini/op.pt"):
        store.verify("refs/mini/op.pt")

    store.put_bytes("small.json", b"{}")
    client.put_object(Bucket=s3_server.bucket, Key="farm/small.json", Body=b"[]", Metadata={"sha256": "0" * 64})
    with pytest.raises(IntegrityError):
        store.get_bytes("small.json")


def test_foreign_object_without_sha256_is_accepted(s3_server, tmp_path):  # noqa: F811
    s3_server.client().put_object(Bucket=s3_server.bucket, Key="farm/foreign.bin", Body=b"abc")
    store = s3_server.store()
    assert store.head("foreign.bin").sha256 is None
    got = store.get_file("foreign.bin", tmp_path / "f")
    assert got.sha256 == hashlib.sha256(b"abc").hexdigest()
    assert store.verify("foreign.bin") == got.sha256


def test_retries_through_503s(s3_server, flaky_proxy, tmp_path):  # noqa: F811
    store = s3_server.store(endpoint_url=flaky_proxy.endpoint, max_attempts=6)
    src = _file(tmp_path / "src.pt", 50_000)
    flaky_proxy.fail_next(2, 503)
    store.put_file("refs/x/op.pt", src)
    assert flaky_proxy.requests == 1  # the third attempt went through
    flaky_proxy.fail_next(1, 500)
    store.get_file("refs/x/op.pt", tmp_path / "back.pt")
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()
    flaky_proxy.fail_next(1, 503)
    assert store.get_bytes("refs/x/op.pt") == src.read_bytes()


def _down_settings(endpoint: str) -> dict:
    return {"endpoint_url": endpoint, "max_attempts": 2, "connect_timeout_s": 1.0, "read_timeout_s": 2.0}


def test_server_down(s3_server, flaky_proxy, tmp_path):  # noqa: F811
    store = s3_server.store(**_down_settings(flaky_proxy.endpoint))
    src = _file(tmp_path / "src.pt", 10_000)
    flaky_proxy.stop()
    start = time.monotonic()
    with pytest.raises(StorageError) as err:
        store.put_file("refs/x/op.pt", src)
    assert time.monotonic() - start < 15
    message = str(err.value)
    assert f"s3://{s3_server.bucket}/farm/refs/x/op.pt" in message and "\n" not in message
    assert "connect" in message.lower()
    with pytest.raises(StorageError, match="farm/refs/x/op.pt"):
        store.head("refs/x/op.pt")

    flaky_proxy.start()  # back, on the same port
    assert store.head("refs/x/op.pt") is None


def test_server_dies_mid_multipart(s3_server, flaky_proxy, tmp_path):  # noqa: F811
    settings = _down_settings(flaky_proxy.endpoint) | {"multipart_threshold_mb": 5, "multipart_chunksize_mb": 5}
    store = s3_server.store(**settings)
    src = _file(tmp_path / "big.pt", 11 * MB, seed=2)
    flaky_proxy.down_after(2)  # CreateMultipartUpload and one part get through, then silence
    with pytest.raises(StorageError, match="upload failed"):
        store.put_file("refs/x/big.pt", src)
    flaky_proxy.down_after(None)
    assert store.head("refs/x/big.pt") is None  # an unfinished multipart upload is invisible
    assert [i.key for i in store.list()] == []


def test_missing_bucket_is_a_storage_error(s3_server):  # noqa: F811
    from farm.storage.s3 import S3Store as Store

    store = Store("farm-no-such-bucket", "p", s3_server.settings())
    with pytest.raises(StorageError, match="no bucket|no object|NoSuchBucket"):
        store.put_bytes("k.json", b"{}")


def test_concurrent_json_documents_stay_valid(s3_server):  # noqa: F811
    """Readers during updates see a whole document, old or new."""
    store = s3_server.store()
    store.update_json("doc.json", _add("seed"))
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads(store.get_bytes("doc.json"))
            except (ValueError, IntegrityError) as exc:
                bad.append(repr(exc))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(10):
        store.update_json("doc.json", _add(f"n{i}"))
    stop.set()
    reader.join()
    assert not bad
