"""Fitting alpha and beta of a collective to measured times (weighted least squares, pure Python).

``fit_alpha_beta(rows, op)`` takes ``(nbytes, p, seconds)`` rows of one collective and returns the
``alpha`` (s per step) and ``beta`` (s per byte) that minimise the *relative* squared error
``sum ((model - t) / t)^2`` — small messages (latency-bound) count as much as large ones. Both are
kept >= 0 (if the unconstrained optimum has a negative one, the other is fitted alone).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from agoq_core.scale.collectives import COLLECTIVES
from agoq_core.scale.errors import ScaleError

__all__ = ["AlphaBetaFit", "fit_alpha_beta", "fit_joint", "predict_collective"]


@dataclass(frozen=True)
class AlphaBetaFit:
    op: str
    alpha: float
    beta: float
    rows: tuple[tuple[float, int, float], ...]
    """(nbytes, p, measured seconds) it was fitted on."""

    @property
    def bandwidth(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else float("inf")

    def predict(self, nbytes: float, p: int) -> float:
        return predict_collective(self.op, nbytes, p, self.alpha, self.beta)

    @property
    def max_relative_error(self) -> float:
        return max(abs(self.predict(n, p) - t) / t for n, p, t in self.rows)

    def to_dict(self) -> dict:
        return {"op": self.op, "alpha_s": self.alpha, "beta_s_per_byte": self.beta, "bandwidth_Bps": self.bandwidth,
                "rows": [list(r) for r in self.rows], "max_relative_error": self.max_relative_error}


def _coeffs(op: str, nbytes: float, p: int) -> tuple[float, float]:
    if op not in COLLECTIVES:
        raise ScaleError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    steps, factor = COLLECTIVES[op]
    return float(steps(p)), float(factor(p)) * nbytes


def predict_collective(op: str, nbytes: float, p: int, alpha: float, beta: float) -> float:
    a, b = _coeffs(op, nbytes, p)
    return a * alpha + b * beta


def fit_alpha_beta(rows: Iterable[Sequence[float]], op: str) -> AlphaBetaFit:
    """Fit one collective's ``(nbytes, p, seconds)`` rows."""
    rows = tuple((float(n), int(p), float(t)) for n, p, t in rows)
    alpha, beta = _solve([(_coeffs(op, n, p), t) for n, p, t in rows])
    return AlphaBetaFit(op=op, alpha=alpha, beta=beta, rows=rows)


def fit_joint(rows: Iterable[Sequence]) -> tuple[float, float]:
    """One (alpha, beta) for ``(op, nbytes, p, seconds)`` rows of several collectives on the same link."""
    return _solve([(_coeffs(op, float(n), int(p)), float(t)) for op, n, p, t in rows])


def _solve(X: list[tuple[tuple[float, float], float]]) -> tuple[float, float]:
    if len(X) < 2:
        raise ScaleError(f"fitting alpha and beta needs at least 2 measurements, got {len(X)}")
    if any(not t > 0 for _, t in X):
        raise ScaleError("measured times must be > 0")
    # weighted normal equations with weights 1/t^2: minimise sum ((a x + b y) / t - 1)^2
    sxx = sum((a / t) ** 2 for (a, _), t in X)
    syy = sum((b / t) ** 2 for (_, b), t in X)
    sxy = sum((a / t) * (b / t) for (a, b), t in X)
    sx1 = sum(a / t for (a, _), t in X)
    sy1 = sum(b / t for (_, b), t in X)
    det = sxx * syy - sxy * sxy
    alpha = beta = -1.0
    if det > 1e-12 * max(sxx * syy, 1e-300):
        alpha = (sx1 * syy - sy1 * sxy) / det
        beta = (sy1 * sxx - sx1 * sxy) / det
    if alpha < 0 or beta < 0:  # one parameter alone, the better of the two
        cand = []
        if syy > 0:
            cand.append((0.0, sy1 / syy))
        if sxx > 0:
            cand.append((sx1 / sxx, 0.0))
        if not cand:
            raise ScaleError("the measurements carry neither steps nor bytes (p = 1?): nothing to fit")

        def err(ab):
            return sum(((a * ab[0] + b * ab[1]) / t - 1) ** 2 for (a, b), t in X)

        alpha, beta = min(cand, key=err)
    return alpha, beta
