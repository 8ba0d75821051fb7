"""Comparison baselines from the research, with the same estimator contract as
:mod:`analytics.detectors` (higher score = more anomalous, label-free threshold).

* :class:`PCAReconstruction` — Prodigy's idea (reconstruction error of a model of
  normal behaviour; Prodigy uses a VAE over tsfresh features) with a linear
  autoencoder: PCA on the standardised windows, score = squared reconstruction error.
  Contributions are the per-feature squared residuals (they sum exactly to the score).
* :class:`GaussianMixtureNLL` — eACGM's idea: a Gaussian mixture of the windows,
  score = negative log-likelihood. Contributions (diagonal covariance only, exact up
  to the mixture weights) are the per-feature NLL terms of the most responsible
  component.

Both fit on whatever reference they are given, like the other detectors: they have no
robustness to a contaminated reference beyond the shared robust standardisation, which
is precisely why the research found them weak.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from sklearn.decomposition import PCA
from sklearn.mixture import GaussianMixture

from analytics.detectors import Array, _Detector


class PCAReconstruction(_Detector):
    """Squared reconstruction error of PCA keeping ``n_components`` (an int, or a
    fraction of explained variance)."""

    def __init__(self, n_components: int | float = 0.9, standardize: bool = True,
                 floors: ArrayLike | None = None, threshold_k: float = 4.0,
                 random_state: int | None = None) -> None:
        self.n_components = n_components
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k
        self.random_state = random_state

    def fit(self, X: ArrayLike, y: object = None) -> PCAReconstruction:
        z = self._fit_scaler_rows(self._validate_rows(X)).dense()
        n, p = z.shape
        nc: int | float = self.n_components
        if isinstance(nc, int) and not isinstance(nc, bool):
            nc = max(0, min(nc, n, p))
        elif not 0.0 < float(nc) < 1.0:
            raise ValueError(f"PCAReconstruction: n_components must be an int or a fraction in (0, 1), not {nc!r}")
        if n < 2 or p == 0 or nc == 0 or not np.any(np.ptp(z, axis=0) > 0):
            self.pca_ = None
            self.mean_ = z.mean(axis=0) if n else np.zeros(p)
        else:
            self.pca_ = PCA(n_components=nc, svd_solver="full", random_state=self.random_state).fit(z)
            self.mean_ = self.pca_.mean_
        self._calibrate(self._score_z(z))
        return self

    def _residual(self, z: Array) -> Array:
        if self.pca_ is None:
            return np.asarray(z - self.mean_)
        return np.asarray(z - self.pca_.inverse_transform(self.pca_.transform(z)))

    def _score_z(self, z: Array) -> Array:
        r = self._residual(z)
        return np.asarray(np.einsum("ij,ij->i", r, r))

    def contributions(self, X: ArrayLike) -> Array:
        """Squared residual per feature; rows sum exactly to the score."""
        r = self._residual(self._z(X))
        return r * r


class GaussianMixtureNLL(_Detector):
    """Negative log-likelihood under a Gaussian mixture of the reference windows."""

    _log_scale = False  # NLL can be negative

    def __init__(self, n_components: int = 3, covariance_type: Literal["full", "tied", "diag", "spherical"] = "diag",
                 reg_covar: float = 1e-3, standardize: bool = True, floors: ArrayLike | None = None,
                 threshold_k: float = 4.0, random_state: int | None = None) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.reg_covar = reg_covar
        self.standardize = standardize
        self.floors = floors
        self.threshold_k = threshold_k
        self.random_state = random_state

    def fit(self, X: ArrayLike, y: object = None) -> GaussianMixtureNLL:
        z = self._fit_scaler_rows(self._validate_rows(X)).dense()
        k = max(1, min(int(self.n_components), np.unique(z, axis=0).shape[0]))  # no more than distinct rows
        zf = z if z.shape[0] >= 2 else np.vstack([z, z])  # GaussianMixture needs 2 rows
        self.gmm_ = GaussianMixture(n_components=k, covariance_type=self.covariance_type,
                                    reg_covar=self.reg_covar, random_state=self.random_state).fit(zf)
        self._calibrate(self._score_z(z))
        return self

    def _score_z(self, z: Array) -> Array:
        return np.asarray(-self.gmm_.score_samples(z))

    def contributions(self, X: ArrayLike) -> Array:
        """Per-feature NLL terms of the most responsible component (diagonal/spherical
        covariance); for full/tied covariance, squared standardised deviations."""
        z = self._z(X)
        comp = self.gmm_.predict(z)
        mu = self.gmm_.means_[comp]
        if self.covariance_type == "diag":
            var = self.gmm_.covariances_[comp]
        elif self.covariance_type == "spherical":
            var = np.repeat(self.gmm_.covariances_[comp][:, None], z.shape[1], axis=1)
        else:
            var = np.ones_like(z)
        return np.asarray(0.5 * (z - mu) ** 2 / var)
