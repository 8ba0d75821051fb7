"""Where independent work items run: in this process, on a local process pool, or on Ray.

``make_engine(spec).map(fn, items)`` is ``[fn(x) for x in items]`` run by the engine the
spec names (the ``[scheduler] engine`` key, ``--engine`` flags):

* ``serial``: in this process, one item after the other;
* ``processes`` (the default: one worker per local core) or ``processes:N``: a
  :class:`concurrent.futures.ProcessPoolExecutor` of N workers started with **spawn**:
  Polars (and the scikit-learn/OpenMP pools) run thread pools that ``fork`` copies in an
  unusable state, and a forked child would also inherit the parent's open lake files and
  the scheduler's lock; a spawned worker is a fresh interpreter that imports what it needs
  once and is then reused for every item of every ``map`` of the engine;
* ``ray`` or ``ray:N``: a local Ray cluster started by ``ray.init`` (N CPUs, default all)
  that listens on the loopback interface only (a Ray cluster runs any code sent to it);
* ``ray://HOST:PORT``: an existing Ray cluster through its Ray Client port (10001 by
  default). Every node must have this package installed at the same version.

The engines behave alike: results come back in item order; an exception raised by ``fn``
is re-raised with its own type, with a note (PEP 678) naming the item; a worker that dies
(killed, out of memory) raises :class:`EngineError` naming the unfinished items, and is
not retried (the scheduler's next cycle redoes uncommitted work from the watermarks).
``fn`` and the items must be picklable (a top-level function, plain data) for every
engine but ``serial``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import pickle
import re
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from types import TracebackType
from typing import Any, TypeVar

from ingest import objstore

T = TypeVar("T")
R = TypeVar("R")

#: what a per-host step takes to run its items (``Engine.map`` is one)
Mapper = Callable[[Callable[[T], R], Sequence[T]], list[R]]

DEFAULT = "processes"
SPECS = "serial, processes, processes:N, ray, ray:N or ray://HOST:PORT"
_SPEC = re.compile(r"(?P<kind>serial|processes|ray)(?::(?P<n>\d+))?|(?P<addr>ray://[^\s/:]+:\d+)")
#: how many unfinished items an error lists
_SHOWN = 5
#: Ray listens on the node's address unless this is set before Ray is imported (see RayEngine)
_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class EngineError(RuntimeError):
    """A worker died, or the engine cannot start; the message names the items concerned."""


def parse_spec(spec: str | None, where: str = "engine") -> str:
    """``spec`` normalised (None: the default), or a ValueError naming ``where`` and the
    forms accepted. Nothing is started (a config file is checked with this)."""
    if spec is None:
        return DEFAULT
    if not isinstance(spec, str):
        raise ValueError(f"{where}: expected one of {SPECS}, got {spec!r}")
    s = spec.strip()
    m = _SPEC.fullmatch(s)
    if m is None:
        raise ValueError(f"{where}: unknown engine {spec!r}; expected {SPECS}")
    if m["kind"] == "serial" and m["n"] is not None:
        raise ValueError(f"{where}: 'serial' takes no worker count, got {spec!r}")
    if m["n"] is not None and int(m["n"]) < 1:
        raise ValueError(f"{where}: the worker count must be >= 1, got {spec!r}")
    return s


def local_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def make_engine(spec: str | None = None) -> Engine:
    """The engine ``spec`` names (see the module doc); a ValueError for an unknown spec."""
    s = parse_spec(spec)
    if s == "serial":
        return SerialEngine()
    if s.startswith("ray://"):
        return RayEngine(address=s)
    kind, _, n = s.partition(":")
    if kind == "processes":
        return ProcessEngine(int(n) if n else None)
    return RayEngine(num_cpus=int(n) if n else None)


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _item(i: int, item: object) -> str:
    r = repr(item)
    return f"#{i} {r if len(r) <= 200 else r[:197] + '...'}"


def _noted(exc: BaseException, fn: Callable[..., Any], i: int, item: object) -> BaseException:
    exc.add_note(f"while running {_name(fn)} on item {_item(i, item)}")
    return exc


def _unfinished(items: Sequence[object], done: int) -> str:
    left = [_item(i, items[i]) for i in range(done, min(len(items), done + _SHOWN))]
    more = len(items) - done - len(left)
    return ", ".join(left) + (f" and {more} more" if more > 0 else "")


class Engine(ABC):
    """Runs ``fn`` over items (see the module doc); a context manager that closes itself."""

    spec: str

    @property
    @abstractmethod
    def workers(self) -> int:
        """How many items can run at once."""

    @abstractmethod
    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(x) for x in items]``, run by this engine, in item order."""

    def close(self) -> None:  # noqa: B027 -- the serial engine holds nothing
        """Stop the workers (idempotent)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec!r}>"


class SerialEngine(Engine):
    spec = "serial"

    @property
    def workers(self) -> int:
        return 1

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        out = []
        for i, item in enumerate(items):
            try:
                out.append(fn(item))
            except Exception as exc:
                _noted(exc, fn, i, item)
                raise
        return out


def _check_picklable(fn: Callable[..., Any], engine: str) -> None:
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(f"{engine} engine: {_name(fn)} cannot be sent to a worker process (use a top-level "
                        f"function): {exc}") from None


@contextlib.contextmanager
def _worker_env(polars_threads: int) -> Iterator[None]:
    """The environment of the workers spawned meanwhile: ``POLARS_MAX_THREADS`` (Polars reads
    it at import, which a spawned worker does before anything of ours runs in it; the
    operator's setting wins) and the object-storage endpoint and region configured here
    (:func:`ingest.objstore.worker_env`: the config file's ``[lake]`` keys)."""
    env = objstore.worker_env()
    if "POLARS_MAX_THREADS" not in os.environ:
        env["POLARS_MAX_THREADS"] = str(polars_threads)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _exit_with_parent(parent: int) -> None:
    """A pool worker's initializer: exit once the process that started it is gone. A
    worker blocks on its call queue and would outlive a killed parent (SIGKILL, the OOM
    killer) for good, holding its memory and the parent's stdout/stderr open."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class ProcessEngine(Engine):
    """A spawn-started :class:`~concurrent.futures.ProcessPoolExecutor` (see the module doc),
    started at the first ``map`` and restarted after a worker died."""

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"processes engine: the worker count must be >= 1, got {workers}")
        self._workers = workers or local_cores()
        self.spec = f"processes:{self._workers}"
        self._pool: cf.ProcessPoolExecutor | None = None

    @property
    def workers(self) -> int:
        return self._workers

    def _executor(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_exit_with_parent, initargs=(os.getpid(),))
        return self._pool

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if not items:
            return []
        _check_picklable(fn, "processes")
        pool = self._executor()
        with _worker_env(self._polars_threads()):  # (workers start at a submit)
            futures = [pool.submit(fn, item) for item in items]
        out: list[R] = []
        try:
            for i, fut in enumerate(futures):
                try:
                    out.append(fut.result())
                except BrokenProcessPool as exc:
                    self._discard()
                    raise EngineError(
                        f"processes engine: a worker process died (killed, or out of memory; or its result did not unpickle: "
                        f"see the cause) while running "
                        f"{_name(fn)}; unfinished items: {_unfinished(items, i)}") from exc
                except Exception as exc:  # fn's own (its remote traceback is the __cause__)
                    _noted(exc, fn, i, items[i])
                    raise
        finally:
            for fut in futures[len(out):]:
                fut.cancel()
        return out

    def _polars_threads(self) -> int:
        """Polars threads per worker: the local cores shared out, so N workers do not run
        N thread pools of every core each (measured: 2 workers on 2 cores sweep 1.5x
        faster than one with a pool of 2 threads each; see docs/operations.md)."""
        return max(1, local_cores() // self._workers)

    def _discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        self._discard()


#: how often a ray:// connection is tried when the cluster fails to start the connection's
#: own client server (Ray starts one process per client; on a loaded 2-core machine that
#: start failed now and then while the next one worked: seen in CI)
RAY_CLIENT_TRIES = 3


def _init_ray(ray: Any, address: str | None, kw: dict[str, Any]) -> None:
    for attempt in range(1, RAY_CLIENT_TRIES + 1):
        try:
            ray.init(address, **kw)
            return
        except ConnectionError as exc:
            if attempt == RAY_CLIENT_TRIES or "Starting Ray client server failed" not in str(exc):
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(2.0 * attempt)


class RayEngine(Engine):
    """Ray tasks (``max_retries=0``: see the module doc). ``address`` None starts a local
    cluster of ``num_cpus`` CPUs (default all) on loopback, shut down by :meth:`close`; a
    ``ray://`` address connects to a running cluster (disconnected by :meth:`close`). When
    Ray is already initialised in this process it is used as it is and left running."""

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        if "ray" not in sys.modules:
            # before Ray reads its constants: a cluster this process starts (now, or later
            # with the local spec) binds loopback, not the node's address: whoever reaches
            # a Ray cluster runs code on it. (A client of a ray:// cluster is unaffected.)
            os.environ.setdefault(_RAY_LOOPBACK_ENV, "0")
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - ray is a dependency
            raise EngineError(f"engine {address or 'ray'}: Ray is not installed ({exc}); "
                              "pip install 'ray[client]'") from None
        self._ray = ray
        self._owned = not ray.is_initialized()
        if self._owned:
            kw: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False, **(init_kwargs or {})}
            if objstore.worker_env():  # (the config's lake endpoint: Ray's workers read the variables)
                kw.setdefault("runtime_env", {"env_vars": objstore.worker_env()})
            if address is None:
                kw.setdefault("include_dashboard", False)
                if num_cpus is not None:
                    kw["num_cpus"] = num_cpus
            try:
                _init_ray(ray, address, kw)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                hint = ("" if address is None or os.environ.get("RAY_AUTH_MODE") else
                        " (a cluster with token authentication also times out when this environment lacks "
                        "RAY_AUTH_MODE=token and its token: docs/operations.md, Parallel sweeps)")
                raise EngineError(f"engine {address or 'ray'}: cannot start or reach the Ray cluster: {exc}{hint}") \
                    from exc
        self.spec = address or ("ray" if num_cpus is None else f"ray:{num_cpus}")
        self._closed = False

    @property
    def workers(self) -> int:
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self._closed:
            raise EngineError(f"engine {self.spec} is closed")
        if not items:
            return []
        ray = self._ray
        from ray.exceptions import RayError, RayTaskError

        task = ray.remote(max_retries=0)(fn)
        refs = [task.remote(item) for item in items]
        out: list[R] = []
        try:
            for i, ref in enumerate(refs):
                try:
                    out.append(ray.get(ref))
                except RayTaskError as exc:
                    cause = exc.cause if isinstance(exc.cause, Exception) else exc
                    raise _noted(cause, fn, i, items[i]) from exc
                except RayError as exc:  # the worker or its node died, the object was lost ...
                    raise EngineError(f"engine {self.spec}: {type(exc).__name__} while running {_name(fn)}; "
                                      f"unfinished items: {_unfinished(items, i)}: {exc}") from exc
        finally:
            for ref in refs[len(out):]:
                try:
                    ray.cancel(ref, force=True)
                except (RayError, TypeError, ValueError):  # already finished or gone
                    pass
        return out

    def close(self) -> None:
        if not self._closed and self._owned:
            self._ray.shutdown()
        self._closed = True
