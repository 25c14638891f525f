"""Kaldi's online natural gradient (003_d9bc3cbaea538cc1.txt; nnet3 natural-gradient-online.cc)
and the NGSGD optimizer.

The estimate F_t = R_t^T D_t R_t + rho_t I, the preconditioner beta_t G_t^{-1} (SPD, identity
outside the rank-R subspace), the rescaling, the update schedule (10 updates, then every
update_period), Kaldi's defaults, the gradient plumbing (alpha -> infinity gives plain SGD),
convergence against SGD, exact resume, and NG-SGD with model averaging in the simulator (the
multi-process equality is the ``ma_ngsgd`` / ``gossip_bmuf_ngsgd`` scenarios).
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from gossip_accel.sync import toy
from gossip_accel.sync.simulate import simulate
from gossip_accel.train.natural_gradient import OnlineNaturalGradient
from gossip_accel.train.ngsgd import NGSGD, kaldi_rank

TOY_CFG = {"components": toy.TOY_COMPONENTS, "period": 4}


def lowrank_data(d=30, rank=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(d, rank, generator=g))
    cov = U @ torch.diag(torch.tensor([100.0, 50.0, 20.0, 10.0, 5.0][:rank])) @ U.T + 0.1 * torch.eye(d)
    L = torch.linalg.cholesky(cov)

    def batch(n=200):
        return torch.randn(n, d, generator=g) @ L.T

    return U, cov, batch


# -- the estimate ------------------------------------------------------------------------------------
def test_estimate_tracks_a_low_rank_plus_noise_covariance():
    U, cov, batch = lowrank_data()
    ng = OnlineNaturalGradient(rank=5, update_period=1, num_samples_history=2000, alpha=4)
    for _ in range(300):
        ng.precondition(batch())
    R, d, rho = ng.fisher()
    torch.testing.assert_close(R @ R.T, torch.eye(5, dtype=torch.float64), atol=1e-4, rtol=0)  # orthonormal rows
    assert float(d.min()) > 0 and rho > 0
    # the subspace of R is that of the covariance's top eigenvectors, eigenvalues d + rho, noise rho
    cosines = torch.linalg.svdvals(U.double().T @ R.T)
    assert float(cosines.min()) > 0.99
    torch.testing.assert_close(d + rho, torch.tensor([100.0, 50, 20, 10, 5], dtype=torch.float64), rtol=0.2, atol=0)
    assert rho == pytest.approx(0.1, rel=0.3)
    F = R.T @ torch.diag(d) @ R + rho * torch.eye(30, dtype=torch.float64)
    assert float(torch.trace(F)) == pytest.approx(float(torch.trace(cov)), rel=0.1)


def test_preconditioner_is_spd_and_the_identity_outside_the_subspace():
    _, _, batch = lowrank_data(seed=1)
    ng = OnlineNaturalGradient(rank=5, update_period=1, num_samples_history=500, alpha=4)
    for _ in range(30):
        ng.precondition(batch())
    P = ng.preconditioner()
    torch.testing.assert_close(P, P.T)
    ev = torch.linalg.eigvalsh(P)
    assert float(ev.min()) > 0 and float(ev.max()) <= 1 + 1e-6
    R, d, rho = ng.fisher()
    # identity on the orthogonal complement of R's rows, a strict shrinkage inside it
    Q, _ = torch.linalg.qr(torch.cat([R.T, torch.randn(30, 25, dtype=torch.float64)], dim=1))
    comp = Q[:, 5:]
    torch.testing.assert_close(P @ comp, comp, atol=1e-5, rtol=0)
    inside = R @ P @ R.T
    assert float(torch.linalg.eigvalsh(inside).max()) < 1.0
    # and it is beta_t G_t^{-1} with G_t = F_t + alpha/D tr(F_t) I (eqn:betat2)
    D = 30
    F = R.T @ torch.diag(d) @ R + rho * torch.eye(D, dtype=torch.float64)
    G = F + 4.0 / D * torch.trace(F) * torch.eye(D, dtype=torch.float64)
    beta = rho * (1 + 4.0) + 4.0 / D * float(d.sum())
    torch.testing.assert_close(P, beta * torch.linalg.inv(G), atol=1e-5, rtol=1e-5)


def test_precondition_applies_the_pre_update_estimate_and_keeps_the_norm():
    _, _, batch = lowrank_data(seed=2)
    ng = OnlineNaturalGradient(rank=5, update_period=1, alpha=4)
    for _ in range(12):
        ng.precondition(batch())
    P = ng.preconditioner()
    X = batch(64)
    X_hat, gamma = ng.precondition(X)  # uses P, then updates the estimate
    torch.testing.assert_close(X_hat.double(), X.double() @ P, atol=1e-3, rtol=1e-4)
    assert gamma * float(torch.linalg.vector_norm(X_hat)) == pytest.approx(float(torch.linalg.vector_norm(X)), rel=1e-4)
    assert gamma >= 1.0  # P shrinks: the rescaling gives the norm back


def test_trace_of_the_new_estimate_is_that_of_the_smoothed_scatter():
    # (eqn:rhot1): rho_{t+1} is chosen so that tr(F_{t+1}) = tr(T_t), T_t = eta S_t + (1-eta) F_t
    _, _, batch = lowrank_data(seed=3)
    ng = OnlineNaturalGradient(rank=5, update_period=1, num_samples_history=300, alpha=4)
    for _ in range(15):
        ng.precondition(batch())
    R, d, rho = ng.fisher()
    X = batch(100).double()
    eta = ng.eta(100)
    trace_t = eta * float((X * X).sum()) / 100 + (1 - eta) * (30 * rho + float(d.sum()))
    ng.precondition(X.float())
    _, d1, rho1 = ng.fisher()
    assert 30 * rho1 + float(d1.sum()) == pytest.approx(trace_t, rel=1e-4)


def test_update_schedule_ten_then_every_update_period():
    _, _, batch = lowrank_data(seed=4)
    ng = OnlineNaturalGradient(rank=3, update_period=4)
    ts = []
    for _ in range(30):
        ng.precondition(batch(20))
        ts.append(ng.t)
    assert ts[:10] == list(range(1, 11))  # the first batch initializes (t = 0) and updates: t = 1
    assert ts[10:13] == [10, 10, 10] and ts[13] == 11  # then one update every 4 minibatches
    assert ts[-1] == 10 + (30 - 10) // 4
    assert ng.eta(2000) == pytest.approx(1 - math.exp(-1))


def test_one_dimension_and_rank_limits():
    ng = OnlineNaturalGradient(rank=5)
    X = torch.randn(7, 1)
    out, gamma = ng.precondition(X)
    assert torch.equal(out, X) and gamma == 1.0
    ng = OnlineNaturalGradient(rank=10)
    ng.precondition(torch.randn(50, 4))
    assert ng.rank == 3  # rank < D
    assert torch.isfinite(ng.precondition(torch.zeros(8, 4))[0]).all()  # zero input does not crash


# -- the optimizer ------------------------------------------------------------------------------------
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 200)
        self.b = torch.nn.Linear(200, 3)
        self.c = torch.nn.Linear(3, 1)
        self.emb = torch.nn.Embedding(10, 64)

    def forward(self, ids):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(self.emb(ids))))))


def test_kaldi_defaults():
    opt = NGSGD(MLP(), lr=0.1)
    assert opt.defaults["alpha"] == 4.0 and opt.defaults["num_samples_history"] == 2000.0
    assert opt.defaults["update_period"] == 4
    ranks = {tuple(l.weight.shape): (pi.rank, po.rank) for l in opt.layers for pi, po in [opt.preconditioners(l)]}
    # rank_in = min(20, (in + 1) / 2), rank_out = min(80, (out + 1) / 2), as nnet3
    assert ranks == {(200, 64): (20, 80), (3, 200): (20, 2), (1, 3): (2, 1)}
    assert kaldi_rank(1000, 80) == 80 and kaldi_rank(7, 80) == 4
    assert len(opt.param_groups[0]["params"]) == 7  # the embedding takes a plain SGD step


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_without_smoothing_limit_the_step_is_the_plain_gradient():
    # alpha -> infinity: G_t -> a multiple of I, the preconditioner -> identity, NG-SGD -> SGD;
    # this checks the plumbing: hooks, bias column, several forwards before one backward
    torch.manual_seed(0)
    model = MLP()
    opt = NGSGD(model, lr=0.1, alpha=1e9)
    ids = torch.randint(0, 10, (8, 5))
    out = model(ids).sum() + model(ids[:3]).pow(2).sum()  # two uses of every layer
    opt.zero_grad()  # after the forward, before the backward: the captures must survive
    out.backward()
    plain = _grads(model)
    opt.precondition_gradients()
    for n, g in _grads(model).items():
        torch.testing.assert_close(g, plain[n], rtol=1e-3, atol=1e-6, msg=n)


def test_natural_gradient_changes_the_direction_but_not_the_emb_gradient():
    torch.manual_seed(0)
    model = MLP()
    opt = NGSGD(model, lr=0.1)
    model(torch.randint(0, 10, (16, 4))).pow(2).sum().backward()
    plain = _grads(model)
    opt.precondition_gradients()
    ng = _grads(model)
    assert torch.equal(ng["emb.weight"], plain["emb.weight"])
    cos = torch.nn.functional.cosine_similarity(ng["a.weight"].flatten(), plain["a.weight"].flatten(), dim=0)
    assert 0.0 < float(cos) < 0.9999  # a descent direction, not the gradient itself


def regression(seed=0, n=4096, d=32):
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, 1.5, d)  # inputs spanning a factor 30 in scale: ill-conditioned
    X = torch.randn(n, d, generator=g) * scales
    w = torch.randn(d, 4, generator=g) / scales[:, None]
    return X, X @ w + 0.1 * torch.randn(n, 4, generator=g)


def fit(make_opt, X, Y, loss_fn, steps=300, bs=64, out=4):
    torch.manual_seed(1)
    m = torch.nn.Linear(X.shape[1], out)
    opt = make_opt(m)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        idx = torch.randint(0, X.shape[0], (bs,), generator=g)
        loss = loss_fn(m(X[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(loss_fn(m(X), Y))


def test_converges_at_least_as_well_as_sgd_on_least_squares():
    X, Y = regression()
    mse = torch.nn.functional.mse_loss
    sgd = {lr: fit(lambda m: torch.optim.SGD(m.parameters(), lr=lr), X, Y, mse) for lr in (3e-4, 1e-3, 3e-3)}
    ng = {lr: fit(lambda m: NGSGD(m, lr=lr), X, Y, mse) for lr in (3e-4, 1e-3, 3e-3)}
    for lr in sgd:
        assert ng[lr] < sgd[lr], (lr, ng[lr], sgd[lr])
    assert min(ng.values()) < 0.75 * min(sgd.values())


def test_converges_at_least_as_well_as_sgd_on_classification():
    g = torch.Generator().manual_seed(5)
    scales = torch.logspace(0, 1.2, 20)
    X = torch.randn(4096, 20, generator=g) * scales
    labels = (X / scales) @ torch.randn(20, 5, generator=g)
    Y = labels.argmax(1)
    ce = torch.nn.functional.cross_entropy
    for lr in (3e-3, 1e-2):
        s = fit(lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9), X, Y, ce, out=5)
        n = fit(lambda m: NGSGD(m, lr=lr, momentum=0.9), X, Y, ce, out=5)
        assert n <= s, (lr, n, s)


def test_state_dict_resumes_exactly():
    X, Y = regression(seed=3, n=512)
    torch.manual_seed(0)
    m1 = torch.nn.Linear(32, 4)
    m2 = copy.deepcopy(m1)
    o1 = NGSGD(m1, lr=1e-3, momentum=0.5)

    def step(m, o, i):
        idx = torch.arange(i * 32, (i + 1) * 32) % 512
        o.zero_grad()
        torch.nn.functional.mse_loss(m(X[idx]), Y[idx]).backward()
        o.step()

    for i in range(14):
        step(m1, o1, i)
    saved = copy.deepcopy(o1.state_dict())
    m2.load_state_dict(m1.state_dict())
    o2 = NGSGD(m2, lr=1e-3, momentum=0.5)
    o2.load_state_dict(saved)
    for i in range(14, 24):
        step(m1, o1, i)
        step(m2, o2, i)
    assert torch.equal(m1.weight, m2.weight) and torch.equal(m1.bias, m2.bias)


def test_ngsgd_with_model_averaging_trains_in_the_simulator():
    # Kaldi nnet3: every job NG-SGD on its own data, parameters averaged periodically (003);
    # on the toy task it does at least as well as SGD with the same averaging
    initial = toy.heldout_loss(toy.ToyModel())
    for algo in ("ma", "gossip_bmuf"):
        final = {}
        for name, make in (("sgd", lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5)),
                           ("ngsgd", lambda m: NGSGD(m, lr=0.1, momentum=0.5))):
            cluster = simulate(toy.ToyModel, make, lambda m, o, k, t: toy.train_step(m, o, 0, k, t), 4, 128,
                               TOY_CFG, [f"sync.algorithm={algo}", "sync.momentum_rule_c=2.0"])
            final[name] = toy.heldout_loss(cluster.models[0])
        assert final["ngsgd"] < 0.9 * initial, (algo, final)
        assert final["ngsgd"] <= final["sgd"], (algo, final)
