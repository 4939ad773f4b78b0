"""s3:// store: a bucket and key prefix on AWS S3 or any S3-compatible server.

Each object lives at <prefix>/<key> with the sha256 of its bytes in the object metadata
`sha256` (the ETag cannot serve: a multipart ETag is not a digest of the content).
Uploads go through boto3's transfer manager: S3 makes an object visible only once its
PUT (or CompleteMultipartUpload) finishes, so readers never see half of one. Downloads
land in a temporary file beside the destination, are hashed, and only then renamed over it.

JSON documents change through `update_json`, a compare-and-swap on the ETag
(If-Match / If-None-Match) where the server honours conditional writes; a probe at first
use says whether it does, and a best-effort write-then-check loop stands in where not.

boto3 is an optional extra, imported here only.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.config import S3Settings
from farm.errors import FarmError, IntegrityError, StorageError
from farm.observe import metrics
from farm.storage.base import CHUNK, ObjectInfo, Store, dump_json, parse_json, sha256_file, validate_key

try:
    import boto3
    from boto3.exceptions import Boto3Error
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
    from s3transfer.exceptions import S3DownloadFailedError, S3UploadFailedError
except ImportError:  # the extra is missing: say so when an s3:// store is opened, not at import
    boto3 = None

MB = 1024 * 1024
MISSING = {"NoSuchKey", "404", "NotFound"}
CONFLICT = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling",
                   "BadGateway", "GatewayTimeout"}
UPDATE_ATTEMPTS = 25  # compare-and-swap rounds before update_json gives up
GET_ATTEMPTS = 3  # re-reads when an object is replaced while it is being downloaded
SETTLE_S = (0.5, 1.0)  # fallback: seconds a racing write may take to land before we look again
PROBE_DIR = ".farm-probe"  # a dot segment: never a valid key, so no user object collides


def _code(exc: BaseException | None) -> str:
    """The S3 error code of a ClientError ('' for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _client(s3: S3Settings):
    config = Config(
        s3={"addressing_style": s3.addressing_style or "path"},
        # 'standard' also retries 5xx, SlowDown and dropped connections, unlike 'legacy'.
        retries={"mode": "standard", "max_attempts": s3.max_attempts},
        connect_timeout=s3.connect_timeout_s,
        read_timeout=s3.read_timeout_s,
        # boto3 >= 1.36 sends CRC checksums by default; many S3-compatible servers reject them.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    keys = {}
    if s3.access_key_id and s3.secret_access_key:
        keys = {"aws_access_key_id": s3.access_key_id, "aws_secret_access_key": s3.secret_access_key}
    # A private session: the default one is shared module state and not thread-safe to build.
    session = boto3.session.Session(region_name=s3.region or None)
    client = session.client("s3", endpoint_url=s3.endpoint_url or None, config=config, **keys)
    client.meta.events.register("request-created.s3", _count_retry)
    return client


def _count_retry(request=None, **_) -> None:
    """botocore builds a new request for every attempt; attempts after the first are retries."""
    attempt = ((getattr(request, "context", None) or {}).get("retries") or {}).get("attempt", 1)
    if attempt > 1:
        metrics.STORAGE_RETRIES.labels("s3", "request").inc()


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str, s3: S3Settings):
        if boto3 is None:
            raise FarmError("s3:// stores need boto3: pip install 'kernel-farm[s3]'")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        self.url = f"s3://{bucket}/{self.prefix}"
        self.settings = s3
        self.client = _client(s3)
        self.transfer = TransferConfig(
            multipart_threshold=s3.multipart_threshold_mb * MB,
            multipart_chunksize=s3.multipart_chunksize_mb * MB,
            use_threads=True,
        )
        self._conditional: bool | None = None  # probed on the first update_json
        self._probe_lock = threading.Lock()

    # ------------------------------------------------------------ keys and errors

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1:] if self.prefix else full

    def _where(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"

    @contextmanager
    def _errors(self, action: str, key: str):
        """Turn any boto3/botocore failure into a one-line StorageError naming the object."""
        try:
            yield
        except StorageError:
            raise
        except ClientError as exc:
            if _code(exc) in MISSING:
                raise StorageError(f"{self._where(key)}: no object") from exc
            if _code(exc) == "NoSuchBucket":
                raise StorageError(f"{self._where(key)}: no bucket {self.bucket!r}") from exc
            transient = _code(exc) in TRANSIENT_CODES or str(_code(exc)).startswith("5")
            raise StorageError(f"{self._where(key)}: {action} failed: {_one_line(exc)}", transient) from exc
        except (BotoCoreError, Boto3Error, S3UploadFailedError, S3DownloadFailedError) as exc:
            # connection refused or lost, timeouts: the server may be back for the next run
            raise StorageError(f"{self._where(key)}: {action} failed: {_one_line(exc)}", transient=True) from exc

    # ------------------------------------------------------------ writes

    def put_file(self, key: str, path: Path, sha256: str | None = None) -> ObjectInfo:
        path = Path(path)
        try:
            before = os.stat(path)
            sha = sha256_file(path)  # hashed first: the upload may read the file in parallel parts
        except OSError as exc:
            raise StorageError(f"cannot read {path} to store it as {self._where(key)}: {exc}") from exc
        if sha256 and sha != sha256:
            raise IntegrityError(f"{path} does not match the sha256 it was given ({sha} != {sha256})")
        with self._errors("upload", key):
            self.client.upload_file(
                str(path), self.bucket, self._full(key), ExtraArgs={"Metadata": {"sha256": sha}}, Config=self.transfer
            )
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            # The recorded sha256 may not describe what was sent: do not leave a lying object.
            self.delete(key)
            raise IntegrityError(f"{path} changed while it was uploaded to {self._where(key)}")
        return ObjectInfo(key, before.st_size, sha)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        sha = hashlib.sha256(data).hexdigest()
        with self._errors("write", key):
            self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data, Metadata={"sha256": sha})
        return ObjectInfo(key, len(data), sha)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

    # ------------------------------------------------------------ reads

    def _head(self, key: str) -> dict | None:
        try:
            with self._errors("head", key):
                return self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except StorageError as exc:
            if _code(exc.__cause__) in MISSING:
                return None
            raise

    def head(self, key: str) -> ObjectInfo | None:
        resp = self._head(key)
        if resp is None:
            return None
        return ObjectInfo(key, resp["ContentLength"], resp.get("Metadata", {}).get("sha256"))

    def _expect(self, key: str) -> dict:
        resp = self._head(key)
        if resp is None:
            raise StorageError(f"{self._where(key)}: no object")
        return resp

    def get_file(self, key: str, dest: Path) -> ObjectInfo:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(GET_ATTEMPTS):
            head = self._expect(key)
            recorded = head.get("Metadata", {}).get("sha256")
            tmp = self._download(key, dest)
            try:
                sha = _hash_and_sync(tmp)
                if recorded and sha != recorded:
                    if self._replaced(key, head):
                        continue  # a writer replaced the object between our head and our read
                    raise IntegrityError(f"{self._where(key)} is corrupt: sha256 {sha} != recorded {recorded}")
                os.replace(tmp, dest)
                return ObjectInfo(key, os.stat(dest).st_size, sha)
            finally:
                Path(tmp).unlink(missing_ok=True)
        raise StorageError(f"{self._where(key)}: the object kept changing while it was read")

    def _download(self, key: str, dest: Path) -> str:
        """Stream the object into a temporary file beside `dest`; returns its path."""
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        os.close(fd)
        try:
            with self._errors("download", key):
                self.client.download_file(self.bucket, self._full(key), tmp, Config=self.transfer)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return tmp

    def _replaced(self, key: str, head: dict) -> bool:
        now = self._head(key)
        return now is None or now.get("ETag") != head.get("ETag")

    def _get(self, key: str, **conditions) -> dict:
        with self._errors("read", key):
            return self.client.get_object(Bucket=self.bucket, Key=self._full(key), **conditions)

    def _read_verified(self, key: str) -> tuple[bytes, str]:
        """A small object's bytes, checked against the sha256 of the same response, and its ETag."""
        resp = self._get(key)
        with self._errors("read", key):
            data = resp["Body"].read()
        recorded = resp.get("Metadata", {}).get("sha256")
        if recorded and hashlib.sha256(data).hexdigest() != recorded:
            raise IntegrityError(f"{self._where(key)} is corrupt: its sha256 does not match the recorded one")
        return data, resp["ETag"]

    def get_bytes(self, key: str) -> bytes:
        return self._read_verified(key)[0]

    def verify(self, key: str) -> str:
        resp = self._get(key)
        h = hashlib.sha256()
        with self._errors("read", key):
            for chunk in resp["Body"].iter_chunks(CHUNK):
                h.update(chunk)
        sha = h.hexdigest()
        recorded = resp.get("Metadata", {}).get("sha256")
        if recorded and sha != recorded:
            raise IntegrityError(f"{self._where(key)} is corrupt: sha256 {sha} != recorded {recorded}")
        return sha

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if prefix.startswith("/") or ".." in prefix:
            raise StorageError(f"{self.url}: invalid listing prefix {prefix!r}")
        base = f"{self.prefix}/" if self.prefix else ""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
        with self._errors("list", prefix):
            for page in pages:
                for obj in page.get("Contents", []):
                    rel = self._rel(obj["Key"])
                    if any(seg.startswith(".") for seg in rel.split("/")):
                        continue  # the probe's and other tools' hidden objects are not ours
                    yield ObjectInfo(rel, obj["Size"], None)  # listings carry no metadata

    # ------------------------------------------------------------ JSON documents

    def update_json(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        """Read-modify-write `key` so that concurrent writers all land.

        Where the server honours conditional writes this is a compare-and-swap: GET (ETag),
        mutate, PUT If-Match=<etag> (If-None-Match=* for a new document), and on 412/409
        start over after a jittered pause. Where it does not (the probe says so), the
        fallback is BEST-EFFORT only: write, wait a random moment, re-read; done if the
        stored version is still ours, or if `mutate` applied to it changes nothing (our
        change is already in a later writer's version); otherwise redo from the new version.
        A writer that read before our PUT and writes after our check still loses our change.
        """
        validate_key(key)
        if self.conditional_writes(key):
            return self._update_cas(key, mutate)
        return self._update_checked(key, mutate)

    def _read_doc(self, key: str) -> tuple[dict, str | None]:
        """The document and its ETag; ({}, None) when it does not exist."""
        try:
            data, etag = self._read_verified(key)
        except StorageError as exc:
            if _code(exc.__cause__) in MISSING:
                return {}, None
            raise
        return parse_json(self.describe(key), data), etag

    def _put_doc(self, key: str, doc: dict, **conditions) -> str:
        """Write a document (under `conditions`, if any); returns the new ETag."""
        data = dump_json(doc)
        resp = self.client.put_object(
            Bucket=self.bucket,
            Key=self._full(key),
            Body=data,
            Metadata={"sha256": hashlib.sha256(data).hexdigest()},
            **conditions,
        )
        return resp["ETag"]

    def _update_cas(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        for attempt in range(UPDATE_ATTEMPTS):
            doc, etag = self._read_doc(key)
            new = mutate(doc)
            condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            try:
                with self._errors("conditional write", key):
                    self._put_doc(key, new, **condition)
                return new
            except StorageError as exc:
                # 412: someone wrote first; 409: a concurrent conditional write; 404: deleted meanwhile.
                if _code(exc.__cause__) not in CONFLICT | MISSING:
                    raise
            metrics.STORAGE_RETRIES.labels("s3", "conflict").inc()
            _backoff(attempt)
        raise StorageError(f"{self._where(key)}: update gave up after {UPDATE_ATTEMPTS} attempts (too many writers)")

    def _update_checked(self, key: str, mutate: Callable[[dict], dict]) -> dict:
        for attempt in range(UPDATE_ATTEMPTS):
            doc, _ = self._read_doc(key)
            new = mutate(doc)
            with self._errors("write", key):
                ours = self._put_doc(key, new)
            # Give a writer that read the old version before our PUT time to land its own PUT.
            time.sleep(random.uniform(*SETTLE_S))
            seen, etag = self._read_doc(key)
            if etag == ours:
                return new  # nobody wrote after us
            if mutate(copy.deepcopy(seen)) == seen:
                return seen  # a later writer's version already holds our change
            metrics.STORAGE_RETRIES.labels("s3", "conflict").inc()
            _backoff(attempt)
        raise StorageError(f"{self._where(key)}: update gave up after {UPDATE_ATTEMPTS} attempts (too many writers)")

    def conditional_writes(self, key: str = PROBE_DIR) -> bool:
        """Whether the server honours If-None-Match/If-Match on PUT; probed once per store.
        `key` is the document that asks, so that a failed probe names it."""
        with self._probe_lock:
            if self._conditional is None:
                self._conditional = self._probe(key)
            return self._conditional

    def _probe(self, key: str) -> bool:
        # The probe key bypasses validate_key on purpose: its dot segment keeps it apart from keys.
        probe = "/".join(p for p in (self.prefix, PROBE_DIR, uuid.uuid4().hex) if p)
        with self._errors("probe for conditional writes", key):
            try:
                self._create_only(probe)
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (400, 501):
                    return False  # the server refuses the header outright
                raise
            try:
                self._create_only(probe)
                return False  # a second create-only write went through: the header is ignored
            except ClientError as exc:
                if _code(exc) in CONFLICT:
                    return True
                raise
            finally:
                self._delete_quietly(probe)

    def create_only(self, key: str, data: bytes) -> bool:
        """A PUT with If-None-Match: * where the server honours it (one of two writers gets 412);
        elsewhere the base class's check-then-write."""
        validate_key(key)
        if not self.conditional_writes(key):
            return super().create_only(key, data)
        try:
            with self._errors("conditional write", key):
                self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data, IfNoneMatch="*",
                                       Metadata={"sha256": hashlib.sha256(data).hexdigest()})
        except StorageError as exc:
            if _code(exc.__cause__) in CONFLICT:
                return False
            raise
        return True

    def _create_only(self, full_key: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=full_key, Body=b"", IfNoneMatch="*")

    def _delete_quietly(self, full_key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full_key)
        except (BotoCoreError, ClientError):
            pass  # a stray empty probe object is harmless, and list() hides it


def _backoff(attempt: int) -> None:
    """Full-jitter exponential pause, so that colliding writers spread out."""
    time.sleep(random.uniform(0, min(1.0, 0.02 * 2**attempt)))


def _hash_and_sync(path: str) -> str:
    """sha256 of a downloaded file, streaming, and fsync it before it is renamed into place."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
        os.fsync(f.fileno())
    return h.hexdigest()
