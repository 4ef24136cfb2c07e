"""Exceptions raised by agoq. Every message says what was asked, what was found, and the fix."""
from __future__ import annotations

__all__ = [
    "AgoqError",
    "FormatError",
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "AmbiguousBackendError",
    "PluginError",
    "CapabilityError",
    "BackendMismatchError",
    "NonFiniteError",
    "RankMismatchError",
    "UsageError",
]


class AgoqError(Exception):
    """Base class of every error agoq raises on purpose."""


class FormatError(AgoqError, ValueError):
    """Unknown format name, bad block size, or a tensor the format cannot take."""


class BackendError(AgoqError, RuntimeError):
    """Base class for backend selection and dispatch problems."""


class BackendNotFoundError(BackendError):
    """AGOQ_BACKEND (or an explicit request) names a backend that is not installed."""


class BackendUnavailableError(BackendError):
    """The backend is installed but its probe says it cannot run here (with the reason and a fix)."""


class AmbiguousBackendError(BackendError):
    """Several accelerator backends are available and none was chosen explicitly."""


class PluginError(BackendError):
    """A plugin failed to import, returned malformed records, or clashes with another plugin."""


class CapabilityError(BackendError, NotImplementedError):
    """The selected backend does not claim the capability that was asked for."""


class BackendMismatchError(BackendError):
    """The ranks of a process group use different agoq backends (raised on every rank)."""


class NonFiniteError(AgoqError, FloatingPointError):
    """A tensor that must be finite (e.g. a gradient before the optimizer step) holds NaN or Inf."""


class RankMismatchError(AgoqError, ValueError):
    """Ranks called a collective (or built a data-parallel wrapper) with inputs that disagree: sizes,
    formats, blocks, dtypes or backends. Raised with the same message on every rank."""


class UsageError(AgoqError, ValueError):
    """Command-line arguments or configuration values that are invalid or inconsistent together."""
