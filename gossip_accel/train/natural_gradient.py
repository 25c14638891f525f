"""Kaldi's online natural gradient (NG-SGD), Povey, Zhang, Khudanpur 2014 (003_d9bc3cbaea538cc1.txt).

A torch port of ``OnlineNaturalGradient`` (Kaldi ``src/nnet3/natural-gradient-online.{h,cc}``),
the "online" NG-SGD method of the paper. The Fisher matrix of an affine layer is approximated
by a Kronecker product of two factors, one for the layer's inputs and one for the derivatives
of its outputs; each factor is estimated online as a scaled identity plus a low-rank term,

    F_t = R_t^T D_t R_t + rho_t I                    R_t: R x D, orthonormal rows; D_t diagonal > 0

and every minibatch of vectors X_t (N x D: inputs, or output derivatives) is multiplied by the
inverse of the smoothed estimate and rescaled to keep its norm:

    G_t     = F_t + alpha/D tr(F_t) I = R_t^T D_t R_t + beta_t I,
              beta_t = rho_t (1 + alpha) + alpha/D tr(D_t)                          (eqn:betat2)
    X^_t    = beta_t X_t G_t^{-1} = X_t - X_t W_t^T W_t,   W_t = E_t^{1/2} R_t        (eqn:pt2)
              e_tii = 1 / (beta_t / d_tii + 1)                                       (eqn:tii)
    X-_t    = gamma_t X^_t,   gamma_t = sqrt(tr(X_t X_t^T) / tr(X^_t X^_t^T))

beta_t G_t^{-1} = I - R_t^T E_t R_t is symmetric positive definite with eigenvalues in (0, 1]:
the identity outside the rank-R subspace, a shrinkage inside it (largest for the directions of
largest variance). The estimate follows the scatter S_t = X_t^T X_t / N by one step of the
power method on T_t = eta S_t + (1 - eta) F_t, eta = 1 - exp(-N / S) (S = num_samples_history):

    Y_t = R_t T_t,   Y_t Y_t^T = Z_t = U_t C_t U_t^T                                (eqn:yt, eqn:Zt)
    R_{t+1}   = C_t^{-1/2} U_t^T Y_t
    rho_{t+1} = (eta/N tr(X_t X_t^T) + (1-eta)(D rho_t + tr(D_t)) - tr(C_t^{1/2})) / (D - R)   (eqn:rhot1)
    D_{t+1}   = C_t^{1/2} - rho_{t+1} I                                            (eqn:dt1)

(floors: rho >= max(1e-10, 5e-4 max C^{1/2}), D >= 1e-10, C >= (rho_t (1-eta))^2; R_{t+1} is
re-orthogonalized by a Cholesky step when C_t is ill-conditioned). The labels are those of the
derivation in Kaldi's natural-gradient-online.h, which the paper's section on the online
method summarizes; shared/papers holds only the paper's abstract page, so its own equation
numbers are not quoted here. The estimate is updated on every minibatch for the first 10 and
then every ``update_period`` minibatches (preconditioning uses the latest estimate every time);
the first minibatch initializes it with 3 updates on itself.

Kaldi's defaults (nnet3 NaturalGradientAffineComponent): rank 20 for the input side and 80 for
the output side (at most (dim + 1) / 2), alpha = 4, num_samples_history = 2000,
update_period = 4.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

NUM_INITIAL_UPDATES = 10   # updates before update_period applies (hard-coded in Kaldi)
NUM_INIT_ITERS = 3         # power-method iterations on the first minibatch
EPSILON = 1.0e-10          # absolute floor of rho_t and D_t
DELTA = 5.0e-04            # floor of rho_t relative to the largest sqrt(c_t)
CONDITION_THRESHOLD = 1.0e+06
ORTHOGONALITY_THRESHOLD = 1.0e-03


class OnlineNaturalGradient:
    """The online estimate of one Fisher factor and the preconditioning by it (see module doc).

    ``precondition(X)`` returns (X^_t, gamma_t): the preconditioned directions before the
    rescaling and the scale that restores the norm; it updates the estimate as scheduled.
    """

    def __init__(self, rank: int = 40, update_period: int = 1, num_samples_history: float = 2000.0,
                 alpha: float = 4.0):
        if rank < 1 or update_period < 1 or not 0 < num_samples_history <= 1e6 or alpha < 0:
            raise ValueError(f"bad natural-gradient options: rank={rank}, update_period={update_period}, "
                             f"num_samples_history={num_samples_history}, alpha={alpha}")
        self.rank, self.update_period = rank, update_period
        self.num_samples_history, self.alpha = num_samples_history, alpha
        self.t = -1  # not initialized
        self.num_updates_skipped = 0
        self.W: Optional[torch.Tensor] = None  # R x D, W_t = E_t^{1/2} R_t
        self.d: Optional[torch.Tensor] = None  # diag(D_t), float64
        self.rho = 0.0

    # -- the quantities of the module doc ------------------------------------------------
    def eta(self, n: int) -> float:
        """eta = 1 - exp(-N / num_samples_history): the update rate of the estimate."""
        return 1.0 - math.exp(-n / self.num_samples_history)

    def beta(self, d: torch.Tensor, rho: float, dim: int) -> float:
        """beta_t = rho_t (1 + alpha) + alpha/D tr(D_t)   (eqn:betat2)."""
        return rho * (1.0 + self.alpha) + self.alpha * float(d.sum()) / dim

    @staticmethod
    def e_of(d: torch.Tensor, beta: float) -> torch.Tensor:
        """e_tii = 1 / (beta_t / d_tii + 1)   (eqn:tii)."""
        return 1.0 / (beta / d + 1.0)

    def fisher(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(R_t, D_t, rho_t) of F_t = R_t^T D_t R_t + rho_t I (float64), for inspection and tests."""
        dim = self.W.shape[1]
        e = self.e_of(self.d, self.beta(self.d, self.rho, dim))
        R = self.W.double() / e.sqrt()[:, None]
        return R, self.d.clone(), self.rho

    def preconditioner(self) -> torch.Tensor:
        """The D x D matrix P_t = beta_t G_t^{-1} = I - W_t^T W_t applied to every row (float64)."""
        W = self.W.double()
        return torch.eye(W.shape[1], dtype=torch.float64, device=W.device) - W.T @ W

    # -- initialization ---------------------------------------------------------------------
    @staticmethod
    def _orthonormal_special(rows: int, cols: int, device, dtype) -> torch.Tensor:
        """Rows with 1/sqrt(k) at columns r, r + R, r + 2R, ... (no zero rows or columns)."""
        R = torch.zeros(rows, cols, device=device, dtype=dtype)
        for r in range(rows):
            idx = torch.arange(r, cols, rows, device=device)
            R[r, idx] = 1.0 / math.sqrt(len(idx))
        return R

    def _init_default(self, dim: int, device, dtype) -> None:
        if self.rank >= dim:
            self.rank = dim - 1
        self.rho = EPSILON
        self.d = torch.full((self.rank,), EPSILON, dtype=torch.float64, device=device)
        e_tii = 1.0 / (2.0 + (dim + self.rank) * self.alpha / dim)
        self.W = self._orthonormal_special(self.rank, dim, device, dtype) * math.sqrt(e_tii)
        self.t = 0

    def _init(self, X: torch.Tensor) -> None:
        self._init_default(X.shape[1], X.device, X.dtype)
        for _ in range(NUM_INIT_ITERS):
            self._update(X)
        self.t = 0
        self.num_updates_skipped = 0

    # -- preconditioning --------------------------------------------------------------------
    def precondition(self, X: torch.Tensor) -> tuple[torch.Tensor, float]:
        """X (N x D) -> (X^_t, gamma_t); the caller multiplies by gamma_t (Kaldi's ``scale``)."""
        if X.shape[1] == 1:  # one dimension: natural gradient with rescaling is the identity
            return X.clone(), 1.0
        if self.t == -1:
            self._init(X)
        if self.t >= NUM_INITIAL_UPDATES and self.num_updates_skipped < self.update_period - 1:
            self.num_updates_skipped += 1
            return self._apply(X)
        return self._update(X)

    def _apply(self, X: torch.Tensor) -> tuple[torch.Tensor, float]:
        """X^_t = X_t - (X_t W_t^T) W_t and gamma_t, without touching the estimate."""
        tr_x = float((X * X).sum())
        X_hat = X - (X @ self.W.T) @ self.W
        tr_hat = float((X_hat * X_hat).sum())
        return X_hat, (1.0 if tr_hat == 0.0 else math.sqrt(tr_x / tr_hat))

    def _update(self, X: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Precondition with the current estimate and move the estimate one power-method step."""
        N, dim = X.shape
        R, W, d, rho = self.rank, self.W, self.d, self.rho
        eta = self.eta(N)
        H = X @ W.T                                    # N x R
        J = H.T @ X                                    # R x D = W X^T X
        L = (H.T @ H).double()                         # R x R = W X^T X W^T
        K = (J @ J.T).double()                         # R x R
        L = 0.5 * (L + L.T)
        K = 0.5 * (K + K.T)
        beta = self.beta(d, rho, dim)
        e = self.e_of(d, beta)
        inv_sqrt_e = 1.0 / e.sqrt()
        # (eqn:Zt): Z_t = Y_t Y_t^T in terms of K_t, L_t (double precision)
        drho = d + rho
        eta_n, eta1 = eta / N, 1.0 - eta
        KL = inv_sqrt_e[:, None] * inv_sqrt_e[None, :]
        Z = (eta_n ** 2) * KL * K + eta_n * eta1 * KL * L * (drho[:, None] + drho[None, :])
        Z = Z + torch.diag(eta1 ** 2 * drho ** 2)
        z_scale = max(1.0, float(torch.trace(Z)))
        c, U = torch.linalg.eigh(Z / z_scale)
        c, U = c.flip(0) * z_scale, U.flip(1)          # descending, eigenvectors in the columns
        must_reorth = bool(c[0] > CONDITION_THRESHOLD * c[-1])
        c_floor = (rho * (1.0 - eta)) ** 2
        if bool((c < c_floor).any()):
            must_reorth = True
            c = c.clamp(min=c_floor)
        X_hat = X - H @ W
        tr_hat = float((X_hat * X_hat).sum())
        tr_x = tr_hat + float((torch.diagonal(L) * (2.0 - e)).sum())  # tr(X X^T) from tr(X^ X^^T)
        gamma = 1.0 if tr_hat == 0.0 else math.sqrt(max(tr_x, 0.0) / tr_hat)
        sqrt_c = c.sqrt()
        # (eqn:rhot1), (eqn:dt1), floors
        rho1 = (eta / N * tr_x + (1.0 - eta) * (dim * rho + float(d.sum())) - float(sqrt_c.sum())) / (dim - R)
        d1 = sqrt_c - rho1
        floor_val = max(EPSILON, DELTA * float(sqrt_c.max()))
        rho1 = max(rho1, floor_val)
        d1 = d1.clamp(min=EPSILON)
        # W_{t+1} = A_t B_t with B_t = J_t + (1-eta)/(eta/N) (D_t + rho_t I) W_t
        beta1 = self.beta(d1, rho1, dim)
        e1 = self.e_of(d1, beta1)
        B = J.double() + ((1.0 - eta) / eta_n * drho)[:, None] * W.double()
        A = (eta_n * e1.sqrt() / sqrt_c)[:, None] * U.T * inv_sqrt_e[None, :]
        W1 = A @ B
        if must_reorth:
            W1 = self._reorthogonalize(W1, d1, rho1, dim)
        self.W, self.d, self.rho = W1.to(X.dtype), d1, rho1
        self.t += 1
        self.num_updates_skipped = 0
        return X_hat, gamma

    def _reorthogonalize(self, W1: torch.Tensor, d1: torch.Tensor, rho1: float, dim: int) -> torch.Tensor:
        """Make R_{t+1} = E^{-1/2} W_{t+1} orthonormal again (Cholesky of O = R R^T)."""
        e1 = self.e_of(d1, self.beta(d1, rho1, dim))
        sqrt_e1, inv_sqrt_e1 = e1.sqrt(), 1.0 / e1.sqrt()
        O = inv_sqrt_e1[:, None] * (W1 @ W1.T) * inv_sqrt_e1[None, :]
        eye = torch.eye(O.shape[0], dtype=O.dtype, device=O.device)
        if float((O - eye).abs().max()) <= ORTHOGONALITY_THRESHOLD:
            return W1
        try:
            C = torch.linalg.cholesky(O)
        except RuntimeError:
            R = torch.zeros_like(W1)
            R[:, : R.shape[0]] = eye
            return sqrt_e1[:, None] * R
        Cinv = torch.linalg.solve_triangular(C, eye, upper=False)
        M = sqrt_e1[:, None] * Cinv * inv_sqrt_e1[None, :]
        return M @ W1

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"rank": self.rank, "t": self.t, "num_updates_skipped": self.num_updates_skipped,
                "rho": self.rho, "d": None if self.d is None else self.d.tolist(),
                "W": None if self.W is None else self.W.detach().clone()}

    def load_state_dict(self, state: dict) -> None:
        self.rank, self.t = int(state["rank"]), int(state["t"])
        self.num_updates_skipped, self.rho = int(state["num_updates_skipped"]), float(state["rho"])
        self.W = None if state["W"] is None else state["W"].detach().clone()
        self.d = None if state["d"] is None else torch.tensor(state["d"], dtype=torch.float64,
                                                                device=self.W.device if self.W is not None else None)
