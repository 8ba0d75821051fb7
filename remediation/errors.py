"""Exceptions of the remediation package. They subclass ValueError where the cause is bad input,
so the CLI prints them as user errors without a traceback."""

from __future__ import annotations


class RemediationError(Exception):
    """Base class of every error raised by the remediation package."""


class UnknownScriptError(RemediationError, ValueError):
    """A script id that is not in the allowlist (remediation.registry.SCRIPTS)."""


class ParamError(RemediationError, ValueError):
    """A remediation parameter is missing, unknown, or fails its validator."""


class TransitionError(RemediationError, ValueError):
    """An action state change that the transition table does not allow."""


class ActionNotFound(RemediationError, LookupError, ValueError):
    """No action with this id in the queue."""


class VerificationError(RemediationError, ValueError):
    """A verification spec or the before/after data given to it is unusable."""


class FaultValueError(ParamError):
    """A proposal would set a parameter to the value its knowledge-base entry names as the fault."""
