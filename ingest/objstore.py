"""The lake on S3-compatible object storage: the object side of ingest.lake's filesystem seam.

A lake root ``s3://bucket/prefix`` holds the same keys as a local lake holds paths
(``<prefix>/<table>/host=<h>/date=<d>/hour=<hh>/part-*.parquet``, docs/lake.md). Listing,
puts, deletes and footers go through pyarrow's own ``pyarrow.fs.S3FileSystem``; Parquet scans
go through Polars' native object-store reader (``s3://`` URLs with the same endpoint, region
and credentials as ``storage_options``), so a scan keeps Polars' predicate pushdown and the
exact schema handling of a local scan.

Where the settings come from: :func:`configure` (the ``[lake] endpoint`` / ``region`` keys of
the config file), else the standard AWS variables ``AWS_ENDPOINT_URL`` (``AWS_ENDPOINT_URL_S3``),
``AWS_REGION`` (``AWS_DEFAULT_REGION``); credentials from ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` only (or the SDK's own chain: instance
roles, ~/.aws), never from the config file, which is often kept in version control.

Atomicity without rename (docs/lake.md, "Object storage"): an object appears whole or not at
all when its PUT (or its multipart upload's completion) returns, so every data file is its
own commit, written once under a unique name and never modified; compaction keeps the local
protocol's journal (``_compaction/<id>.json``), whose presence next to the output hides the
inputs from readers until they are deleted. Needs read-after-write consistent listings
(AWS S3 since 2020, MinIO, moto).
"""

from __future__ import annotations

import functools
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

SCHEME = "s3://"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rules


class ObjectStoreError(Exception):
    """A lake URL or object-storage setting is wrong; the message names it."""


def is_url(root: object) -> bool:
    """True for an object-storage lake root (``s3://bucket[/prefix]``). A local path never is
    one; a ``Path`` can't be (it would collapse the ``//``)."""
    return isinstance(root, str) and root.startswith(SCHEME)


@dataclass(frozen=True)
class Settings:
    endpoint: str | None = None  # http(s)://host:port of an S3-compatible server; None: AWS
    region: str | None = None


_configured = Settings()


def configure(*, endpoint: str | None = None, region: str | None = None) -> None:
    """Set the endpoint and region of later stores (the config file's ``[lake]`` keys); the
    AWS variables fill in what is not set here."""
    global _configured
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ObjectStoreError(f"[lake] endpoint must start with http:// or https://, got {endpoint!r}")
    _configured = Settings(endpoint, region)


def worker_env() -> dict[str, str]:
    """The variables that give a process started from this one (a sweep's spawned or Ray
    workers) the endpoint and region :func:`configure` set here: such a process imports
    this module afresh and would read only the AWS variables."""
    out = {}
    if _configured.endpoint:
        out["AWS_ENDPOINT_URL_S3"] = _configured.endpoint
    if _configured.region:
        out["AWS_REGION"] = _configured.region
    return out


def _settings() -> Settings:
    env = os.environ
    endpoint = _configured.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    region = _configured.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    return Settings(endpoint, region)


def split_url(root: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → (``bucket``, ``a/b``); a clear error for anything else."""
    if not is_url(root):
        raise ObjectStoreError(f"not an object-storage lake URL: {root!r} (expected s3://bucket/prefix)")
    bucket, _, prefix = root[len(SCHEME):].rstrip("/").partition("/")
    if not _BUCKET_RE.match(bucket) or (prefix and any(p in ("", ".", "..") for p in prefix.split("/"))):
        raise ObjectStoreError(f"bad lake URL {root!r}: expected s3://bucket/prefix with plain path parts")
    return bucket, prefix


@dataclass(frozen=True)
class _Entry:
    """What ingest.lake's partition walk needs of an os.DirEntry."""

    name: str
    path: str
    dir: bool

    def is_dir(self) -> bool:
        return self.dir

    def is_file(self) -> bool:
        return not self.dir


class ObjectStore:
    """One bucket/prefix. Paths handed in and out are ``Path("bucket/prefix/...")`` keys, as
    ingest.lake builds them from the root; :meth:`uri` turns one back into a URL."""

    def __init__(self, url: str, settings: Settings) -> None:
        import pyarrow.fs as pafs

        self.url = url.rstrip("/")
        bucket, prefix = split_url(url)
        self.root = Path(bucket) / prefix if prefix else Path(bucket)
        self.settings = settings
        env = os.environ
        kw: dict[str, Any] = {}
        if settings.endpoint:
            kw["endpoint_override"] = settings.endpoint
            kw["scheme"] = "http" if settings.endpoint.startswith("http://") else "https"
        if settings.region:
            kw["region"] = settings.region
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            kw |= {"access_key": env["AWS_ACCESS_KEY_ID"], "secret_key": env["AWS_SECRET_ACCESS_KEY"]}
            if env.get("AWS_SESSION_TOKEN"):
                kw["session_token"] = env["AWS_SESSION_TOKEN"]
        # Never create or delete buckets: the lake lives in one an operator made. Delayed
        # open: an object under the part size (10 MB) is one PutObject, not the three
        # requests of a multipart upload (larger ones still go in parts); errors then show
        # at close, which put() waits for.
        self.fs: pafs.S3FileSystem = pafs.S3FileSystem(allow_bucket_creation=False, allow_bucket_deletion=False,
                                                       allow_delayed_open=True, **kw)
        opts: dict[str, str] = {}
        if settings.endpoint:
            opts["aws_endpoint_url"] = settings.endpoint
            if settings.endpoint.startswith("http://"):
                opts["aws_allow_http"] = "true"
        if settings.region:
            opts["aws_region"] = settings.region
        for var, key in (("AWS_ACCESS_KEY_ID", "aws_access_key_id"), ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
                         ("AWS_SESSION_TOKEN", "aws_session_token")):
            if env.get(var):
                opts[key] = env[var]
        #: for Polars' scan_parquet / read_parquet of this store's URLs
        self.storage_options: dict[str, str] | None = opts

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r}, endpoint={self.settings.endpoint!r})"

    # -- the seam (the methods ingest.lake's local side has too)

    def uri(self, path: Path) -> str:
        return SCHEME + path.as_posix()

    def scandir(self, path: Path) -> list[_Entry]:
        """The visible children of a "directory" (one delimiter listing); none if absent."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path.as_posix(), allow_not_found=True))
        except FileNotFoundError:
            return []
        out = []
        for info in infos:
            name = info.base_name
            if name and not name.startswith((".", "_")):
                out.append(_Entry(name, info.path, info.type == pafs.FileType.Directory))
        return out

    def exists(self, path: Path) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(path.as_posix()).type != pafs.FileType.NotFound)

    def is_dir(self, path: Path) -> bool:
        """A prefix holding at least one object (object stores have no empty directories)."""
        import pyarrow.fs as pafs

        if path == self.root:
            # the root itself: the bucket must exist (a clear error else), the prefix may be empty
            return bool(self.fs.get_file_info(self.root.parts[0]).type == pafs.FileType.Directory)
        return bool(self.fs.get_file_info(path.as_posix()).type == pafs.FileType.Directory)

    def read_bytes(self, path: Path) -> bytes:
        with self.fs.open_input_stream(path.as_posix()) as f:
            return bytes(f.read())

    def read_text(self, path: Path) -> str:
        return self.read_bytes(path).decode("utf-8")

    def put(self, path: Path, data: bytes) -> None:
        """One PUT: the object appears whole when this returns, or not at all."""
        with self.fs.open_output_stream(path.as_posix()) as f:
            f.write(data)

    def delete(self, path: Path) -> None:
        try:
            self.fs.delete_file(path.as_posix())
        except FileNotFoundError:
            pass

    def read_metadata(self, path: Path) -> pq.FileMetaData:
        import pyarrow.parquet as pq

        return pq.read_metadata(path.as_posix(), filesystem=self.fs)


def parquet_bytes(df: Any, *, compression: str, compression_level: int | None) -> bytes:
    """A frame as one Parquet file in memory (the same writer and options as a local file)."""
    buf = io.BytesIO()
    df.write_parquet(buf, compression=compression, compression_level=compression_level, statistics=True)
    return buf.getvalue()


def store(url: str) -> ObjectStore:
    """The store of a lake URL (one per URL, settings and credentials; cached)."""
    env = os.environ
    creds = tuple(env.get(v) for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
    return _store(url.rstrip("/"), _settings(), creds)


@functools.cache
def _store(url: str, settings: Settings, creds: tuple[str | None, ...]) -> ObjectStore:
    return ObjectStore(url, settings)
