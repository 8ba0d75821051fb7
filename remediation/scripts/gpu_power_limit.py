"""The power management limit of one or more GPUs, through NVML
(nvmlDeviceSetPowerManagementLimit).

Default target: each board's default limit (nvmlDeviceGetPowerManagementDefaultLimit), i.e.
"restore the power limit someone lowered". ``gpu`` is one index (state ``{"power_limit_mw":
N}``) or several (``0,1,7``: state ``{"power_limit_mw@0": N, ...}``, one key per GPU, so a
rollback or a failed apply writes back only the GPUs that changed); a cap lowered on every
GPU of a host is one incident and one action. NVML is reached through the small
:class:`NvmlBackend` interface: :class:`PynvmlBackend` on real hosts, :class:`ReplayBackend` over
recorded readings in tests. Without a GPU or driver the script says "no GPU" and exits 3.
The limit set here does not survive a driver reload or reboot (nor does the lowered one).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Protocol

from remediation.errors import ParamError
from remediation.scripts import _base
from remediation.scripts._base import Context, ScriptFailed, State, Unsupported


class NvmlBackend(Protocol):
    def device_count(self) -> int: ...
    def power_limit_mw(self, index: int) -> int: ...
    def default_limit_mw(self, index: int) -> int: ...
    def limit_constraints_mw(self, index: int) -> tuple[int, int]: ...
    def set_power_limit_mw(self, index: int, mw: int) -> None: ...


class PynvmlBackend:
    """The real NVML through nvidia-ml-py; errors become Unsupported/ScriptFailed with context."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise Unsupported("no GPU support: nvidia-ml-py (pynvml) is not installed") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise Unsupported(f"no GPU: NVML cannot start on this host ({exc})") from None

    def _handle(self, index: int) -> Any:
        try:
            return self._nv.nvmlDeviceGetHandleByIndex(index)
        except self._nv.NVMLError as exc:
            raise Unsupported(f"no GPU {index}: {exc}") from None

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def power_limit_mw(self, index: int) -> int:
        return int(self._nv.nvmlDeviceGetPowerManagementLimit(self._handle(index)))

    def default_limit_mw(self, index: int) -> int:
        return int(self._nv.nvmlDeviceGetPowerManagementDefaultLimit(self._handle(index)))

    def limit_constraints_mw(self, index: int) -> tuple[int, int]:
        lo, hi = self._nv.nvmlDeviceGetPowerManagementLimitConstraints(self._handle(index))
        return int(lo), int(hi)

    def set_power_limit_mw(self, index: int, mw: int) -> None:
        try:
            self._nv.nvmlDeviceSetPowerManagementLimit(self._handle(index), mw)
        except self._nv.NVMLError as exc:
            raise ScriptFailed(f"NVML refused power limit {mw} mW on GPU {index}: {exc}") from exc


class ReplayBackend:
    """Recorded per-GPU readings (``{"gpus": [{"name", "power_limit_mw", "default_limit_mw",
    "min_limit_mw", "max_limit_mw"}]}``); writes change the in-memory copy and, when ``path`` is
    given, the file, so a later process sees them. ``refuse_mw`` makes NVML refuse one value."""

    def __init__(self, data: dict[str, Any], path: Path | None = None, refuse_mw: int | None = None) -> None:
        self.data, self.path, self.refuse_mw = data, path, refuse_mw

    @classmethod
    def load(cls, path: Path) -> ReplayBackend:
        return cls(json.loads(Path(path).read_text()), path)

    def _gpu(self, index: int) -> dict[str, Any]:
        gpus = self.data.get("gpus") or []
        if not gpus:
            raise Unsupported("no GPU: the recording has no devices")
        if index >= len(gpus):
            raise Unsupported(f"no GPU {index}: the recording has {len(gpus)}")
        gpu: dict[str, Any] = gpus[index]
        return gpu

    def device_count(self) -> int:
        return len(self.data.get("gpus") or [])

    def power_limit_mw(self, index: int) -> int:
        return int(self._gpu(index)["power_limit_mw"])

    def default_limit_mw(self, index: int) -> int:
        return int(self._gpu(index)["default_limit_mw"])

    def limit_constraints_mw(self, index: int) -> tuple[int, int]:
        g = self._gpu(index)
        return int(g["min_limit_mw"]), int(g["max_limit_mw"])

    def set_power_limit_mw(self, index: int, mw: int) -> None:
        if mw == self.refuse_mw:
            raise ScriptFailed(f"NVML refused power limit {mw} mW on GPU {index}: NVML_ERROR_INVALID_ARGUMENT")
        self._gpu(index)["power_limit_mw"] = int(mw)
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=1))


def functions(backend_factory: Any) -> tuple[Any, Any, Any]:
    """read/plan/write over a backend created on first use (NVML starts only when needed)."""
    cache: dict[str, NvmlBackend] = {}

    def nv() -> NvmlBackend:
        if "b" not in cache:
            cache["b"] = backend_factory()
            if cache["b"].device_count() == 0:
                raise Unsupported("no GPU: NVML reports 0 devices")
        return cache["b"]

    def keys(ctx: Context, params: dict[str, Any]) -> dict[str, int]:
        """State key -> GPU index: one GPU keeps the single key (and its index in ``extra``)."""
        gpus = list(dict.fromkeys(int(g) for g in str(params.get("gpu", ctx.extra.get("gpu", 0))).split(",")))
        if len(gpus) == 1:
            ctx.extra["gpu"] = gpus[0]
            return {"power_limit_mw": gpus[0]}
        return {f"power_limit_mw@{g}": g for g in gpus}

    def read(ctx: Context, params: dict[str, Any]) -> State:
        return {k: nv().power_limit_mw(g) for k, g in keys(ctx, params).items()}

    def plan(ctx: Context, params: dict[str, Any], current: State) -> State:
        out: State = {}
        for k, gpu in keys(ctx, params).items():
            if "limit_w" in params:
                target = int(round(float(params["limit_w"]) * 1000))
            else:
                target = nv().default_limit_mw(gpu)
            lo, hi = nv().limit_constraints_mw(gpu)
            if not lo <= target <= hi:
                raise ScriptFailed(f"GPU {gpu}: {target} mW is outside the allowed {lo}..{hi} mW")
            out[k] = target
        return out

    def write(ctx: Context, state: State) -> None:
        for k, mw in state.items():
            gpu = int(ctx.extra["gpu"]) if k == "power_limit_mw" else int(k.partition("@")[2])
            nv().set_power_limit_mw(gpu, int(mw))

    return read, plan, write


_STATE_KEY = re.compile(r"power_limit_mw(@\d{1,2})?")


def check_state(script_id: str, state: State) -> State:
    """``{"power_limit_mw": int}`` (one GPU) or ``{"power_limit_mw@N": int, ...}`` (several),
    each within what the registry allows for ``limit_w``."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and _STATE_KEY.fullmatch(k) for k in state):
        raise ParamError(f"{script_id}: state must be {{'power_limit_mw': N}} or {{'power_limit_mw@GPU': N, ...}},"
                         f" got {state!r}")
    out: State = {}
    for k, mw in state.items():
        if mw is None:
            continue
        if isinstance(mw, bool) or not isinstance(mw, int) or not 1000 <= mw <= 5_000_000:
            raise ParamError(f"{script_id}: {k} {mw!r} is not an integer in 1000..5000000")
        out[k] = mw
    return out


def main(argv: list[str] | None = None, backend: NvmlBackend | None = None) -> int:
    read, plan, write = functions((lambda: backend) if backend is not None else PynvmlBackend)
    return _base.main("gpu_power_limit", read, plan, write, argv, check_state=check_state)


if __name__ == "__main__":
    sys.exit(main())
