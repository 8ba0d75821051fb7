"""One demo lake per test session, shared by test_query, test_report and test_demo.

The first test that asks runs :func:`jobs.demo.run_demo` (the same stages as ``unveil
demo``) into a session temp directory; later ones reuse it. Not a pytest plugin: each
test module wraps :func:`get` in a fixture, so no conftest change is needed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs.demo import DemoResult, run_demo


@dataclass(frozen=True)
class DemoLake:
    result: DemoResult
    wall_s: float

    @property
    def lake(self) -> Path:
        return self.result.lake

    @property
    def report(self) -> Path:
        return self.result.report


_CACHE: dict[str, DemoLake] = {}


def get(tmp_path_factory: pytest.TempPathFactory) -> DemoLake:
    if "demo" not in _CACHE:
        base = tmp_path_factory.mktemp("demo")
        t = time.perf_counter()
        res = run_demo(base / "lake", base / "report.html")
        _CACHE["demo"] = DemoLake(res, time.perf_counter() - t)
    return _CACHE["demo"]
