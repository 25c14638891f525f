"""BMUF / MA update rules against numbers computed by hand from Algorithm 1 (lines 10-13, 15)
of 000_07fa007f7f1023ae.txt and eq. 3-6 of 001_3db6b3ddf1f13045.txt (project notation:
eta = block momentum, zeta = block learning rate)."""
from __future__ import annotations

import pytest
import torch

from gossip_accel.sync.algorithms import (BMUFSlots, OuterSlots, block_momentum_from_rule, bmuf_update, ma_update,
                                         new_local_model, outer_update, start_slots)

ETA, ZETA = 0.5, 1.5  # all numbers below are exact binary fractions


def t(*v):
    return torch.tensor(v, dtype=torch.float32)


def test_start_from_is_line_1():
    theta0 = torch.tensor([1.0, 2.0], dtype=torch.float64)
    s = BMUFSlots.start_from(theta0)
    # omega <- theta_0, Delta <- 0 (Algorithm 1, line 1), fp32 copies that do not alias theta_0
    assert s.omega.dtype == torch.float32 and s.delta.dtype == torch.float32
    assert torch.equal(s.omega, t(1.0, 2.0))
    assert torch.equal(s.delta, t(0.0, 0.0))
    theta0.add_(10.0)
    assert torch.equal(s.omega, t(1.0, 2.0))
    s2 = BMUFSlots.start_from(t(3.0))
    assert s2.omega.data_ptr() != s2.delta.data_ptr()


def test_nesterov_bmuf_two_rounds_by_hand():
    slots = BMUFSlots.start_from(t(1.0, 2.0))  # theta_0 = omega = [1, 2], Delta = 0

    # ---- round 1: theta_bar = [2, 0]
    bar = t(2.0, 0.0)
    out = bmuf_update(bar, slots, ETA, ZETA, nesterov=True)
    # line 10: G = theta_bar - theta_{t-H} = [2, 0] - [1, 2]          = [1, -2]
    # line 11: Delta = eta*0 + zeta*G = 1.5*[1, -2]                    = [1.5, -3]
    # line 12: omega = [1, 2] + [1.5, -3]                              = [2.5, -1]
    # line 13: theta = omega + eta*Delta = [2.5, -1] + 0.5*[1.5, -3]   = [3.25, -2.5]
    assert torch.equal(slots.delta, t(1.5, -3.0))
    assert torch.equal(slots.omega, t(2.5, -1.0))
    assert torch.equal(out, t(3.25, -2.5))
    assert out.data_ptr() == bar.data_ptr()  # theta_bar's buffer is reused
    assert out.data_ptr() not in (slots.omega.data_ptr(), slots.delta.data_ptr())

    # ---- round 2: theta_bar = [3, -2]; theta_{t-H} is the model set by line 13: [3.25, -2.5]
    bar = t(3.0, -2.0)
    out = bmuf_update(bar, slots, ETA, ZETA, nesterov=True)
    # line 10: G = [3, -2] - [3.25, -2.5]                              = [-0.25, 0.5]
    # line 11: Delta = 0.5*[1.5, -3] + 1.5*[-0.25, 0.5]                = [0.375, -0.75]
    # line 12: omega = [2.5, -1] + [0.375, -0.75]                      = [2.875, -1.75]
    # line 13: theta = [2.875, -1.75] + 0.5*[0.375, -0.75]             = [3.0625, -2.125]
    assert torch.equal(slots.delta, t(0.375, -0.75))
    assert torch.equal(slots.omega, t(2.875, -1.75))
    assert torch.equal(out, t(3.0625, -2.125))
    assert out.data_ptr() == bar.data_ptr()

    # ---- round 3: theta_bar = [3.0625, -2.125] (nobody moved): G = 0
    bar = t(3.0625, -2.125)
    out = bmuf_update(bar, slots, ETA, ZETA, nesterov=True)
    # line 11: Delta = 0.5*[0.375, -0.75]                              = [0.1875, -0.375]
    # line 12: omega = [2.875, -1.75] + [0.1875, -0.375]               = [3.0625, -2.125]
    # line 13: theta = omega + 0.5*Delta                               = [3.15625, -2.3125]
    assert torch.equal(slots.delta, t(0.1875, -0.375))
    assert torch.equal(slots.omega, t(3.0625, -2.125))
    assert torch.equal(out, t(3.15625, -2.3125))


def test_classic_bmuf_two_rounds_by_hand():
    # CBM: eq. 3-5 of 001 (letters swapped there): the block starts from the global model omega
    slots = BMUFSlots.start_from(t(1.0, 2.0))

    bar = t(2.0, 0.0)
    out = bmuf_update(bar, slots, ETA, ZETA, nesterov=False)
    # eq. 5: G = w_bar - omega = [2, 0] - [1, 2]                        = [1, -2]
    # eq. 4: Delta = eta*0 + zeta*G                                     = [1.5, -3]
    # eq. 3: omega = [1, 2] + [1.5, -3]                                 = [2.5, -1]
    # new local model = omega                                           = [2.5, -1]
    assert torch.equal(slots.delta, t(1.5, -3.0))
    assert torch.equal(slots.omega, t(2.5, -1.0))
    assert torch.equal(out, t(2.5, -1.0))
    assert out.data_ptr() == bar.data_ptr()
    assert out.data_ptr() != slots.omega.data_ptr()

    bar = t(3.0, -2.0)
    out = bmuf_update(bar, slots, ETA, ZETA, nesterov=False)
    # G = [3, -2] - [2.5, -1]                                           = [0.5, -1]
    # Delta = 0.5*[1.5, -3] + 1.5*[0.5, -1]                             = [1.5, -3]
    # omega = [2.5, -1] + [1.5, -3]                                     = [4, -4]
    assert torch.equal(slots.delta, t(1.5, -3.0))
    assert torch.equal(slots.omega, t(4.0, -4.0))
    assert torch.equal(out, t(4.0, -4.0))
    assert out.data_ptr() == bar.data_ptr()


@pytest.mark.parametrize("nesterov", [True, False])
def test_bmuf_matches_reference_equations_on_random_vectors(nesterov):
    g = torch.Generator().manual_seed(0)
    eta, zeta = 0.875, 1.25
    theta0 = torch.randn(50, generator=g)
    slots = BMUFSlots.start_from(theta0)
    omega, delta = theta0.double().clone(), torch.zeros(50, dtype=torch.float64)
    local = theta0.double().clone()  # theta_{t-H}: the model every block starts from
    for _ in range(6):
        bar = local + 0.1 * torch.randn(50, generator=g, dtype=torch.float64)
        out = bmuf_update(bar.float(), slots, eta, zeta, nesterov)
        G = bar - local                       # line 10 (eq. 5)
        delta = eta * delta + zeta * G        # line 11 (eq. 4)
        omega = omega + delta                 # line 12 (eq. 3)
        local = omega + eta * delta if nesterov else omega.clone()  # line 13 / CBM
        torch.testing.assert_close(slots.delta.double(), delta, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(slots.omega.double(), omega, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.double(), local, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("nesterov", [True, False])
def test_bmuf_with_eta_0_and_zeta_1_is_model_averaging(nesterov):
    g = torch.Generator().manual_seed(1)
    slots = BMUFSlots.start_from(torch.randn(7, generator=g))
    for _ in range(5):
        bar = torch.randn(7, generator=g)
        expected = ma_update(bar.clone())
        out = bmuf_update(bar, slots, 0.0, 1.0, nesterov)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(slots.omega, expected, atol=1e-6, rtol=0)


def test_ma_update_is_the_average_itself():
    bar = t(1.0, -3.0)
    out = ma_update(bar)
    assert out is bar
    assert torch.equal(out, t(1.0, -3.0))


# -- eq. 6 of 001 in project notation: zeta * n * (1 - eta) = C --------------------------------
def test_block_momentum_rule():
    assert block_momentum_from_rule(4, 1.0, 1.0) == pytest.approx(0.75)
    assert block_momentum_from_rule(8, 1.0, 1.0) == pytest.approx(0.875)
    assert block_momentum_from_rule(16) == pytest.approx(0.9375)
    assert block_momentum_from_rule(4, 0.5, 1.0) == pytest.approx(0.5)
    assert block_momentum_from_rule(4, 1.0, 2.0) == pytest.approx(0.5)
    for n, zeta, c in [(4, 1.0, 1.0), (8, 1.0, 1.0), (32, 0.8, 1.2), (16, 2.0, 1.0)]:
        eta = block_momentum_from_rule(n, zeta, c)
        assert zeta * n * (1 - eta) == pytest.approx(c)
        assert 0.0 <= eta < 1.0


def test_block_momentum_rule_is_clamped_at_zero():
    assert block_momentum_from_rule(1, 1.0, 1.0) == 0.0
    assert block_momentum_from_rule(2, 0.25, 1.0) == 0.0


# -- new_local_model: which rule a schedule event applies -------------------------------------
def test_new_local_model_sync_with_slots_is_bmuf():
    slots = BMUFSlots.start_from(t(1.0, 2.0))
    bar = t(2.0, 0.0)
    out = new_local_model("sync", bar, slots, ETA, ZETA, True)
    assert torch.equal(out, t(3.25, -2.5))  # as in test_nesterov_bmuf_two_rounds_by_hand
    assert torch.equal(slots.omega, t(2.5, -1.0))
    slots = BMUFSlots.start_from(t(1.0, 2.0))
    out = new_local_model("sync", t(2.0, 0.0), slots, ETA, ZETA, False)
    assert torch.equal(out, t(2.5, -1.0))


def test_new_local_model_sync_without_slots_is_ma():
    bar = t(0.5, 4.0)
    out = new_local_model("sync", bar, None, ETA, ZETA, True)
    assert torch.equal(out, t(0.5, 4.0))
    assert out.data_ptr() == bar.data_ptr()


def test_new_local_model_warmup_leaves_slots_alone():
    slots = BMUFSlots(omega=t(1.0, 1.0), delta=t(0.5, -0.5))
    out = new_local_model("warmup", t(7.0, 8.0), slots, ETA, ZETA, True)
    assert torch.equal(out, t(7.0, 8.0))
    assert torch.equal(slots.omega, t(1.0, 1.0))
    assert torch.equal(slots.delta, t(0.5, -0.5))
    assert torch.equal(new_local_model("warmup", t(3.0), None, ETA, ZETA, True), t(3.0))


def test_new_local_model_warmup_end_restarts_slots():
    slots = BMUFSlots(omega=t(1.0, 1.0), delta=t(0.5, -0.5))
    bar = t(7.0, 8.0)
    out = new_local_model("warmup_end", bar, slots, ETA, ZETA, True)
    assert torch.equal(out, t(7.0, 8.0))  # the average itself
    assert torch.equal(slots.omega, t(7.0, 8.0))  # omega <- theta_bar
    assert torch.equal(slots.delta, t(0.0, 0.0))  # Delta <- 0
    assert slots.omega.data_ptr() != out.data_ptr()
    # the next sync starts the block from theta_bar with no momentum:
    out = new_local_model("sync", t(8.0, 8.0), slots, ETA, ZETA, True)
    # G = [8, 8] - [7, 8] = [1, 0]; Delta = 1.5*G = [1.5, 0]; omega = [8.5, 8]; theta = [9.25, 8]
    assert torch.equal(slots.delta, t(1.5, 0.0))
    assert torch.equal(slots.omega, t(8.5, 8.0))
    assert torch.equal(out, t(9.25, 8.0))
    # warmup_end without slots (MA) is just the average
    assert torch.equal(new_local_model("warmup_end", t(2.0), None, ETA, ZETA, True), t(2.0))


# -- outer optimizers (algorithms/outer.py; docs/ALGORITHMS.md "Outer optimizers") ------------------
def nesterov_sgd(eta, zeta, nesterov=True):
    return {"name": "SGD", "lr": zeta, "momentum": eta, "dampening": 0, "nesterov": nesterov}


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_sgd_with_momentum_is_bmuf(nesterov):
    """SGD(lr=zeta, momentum=eta) on p = theta_start with g = p - theta_bar equals BMUF-NBM (nesterov) or
    CBM over many syncs: same new local model, p = omega + eta Delta (NBM) or omega (CBM), buffer = -Delta/zeta."""
    eta, zeta = 0.8, 1.3
    gen = torch.Generator().manual_seed(3)
    theta0 = torch.randn(257, generator=gen)
    bmuf, outer = BMUFSlots.start_from(theta0), OuterSlots.start_from(theta0, nesterov_sgd(eta, zeta, nesterov))
    local = theta0.clone()
    for _ in range(60):
        bar = local + 0.1 * torch.randn(257, generator=gen)  # the block's average: the start model plus progress
        local = bmuf_update(bar.clone(), bmuf, eta, zeta, nesterov)
        got = outer_update(bar.clone(), outer)
        torch.testing.assert_close(got, local, atol=1e-5, rtol=1e-5)
        start = bmuf.omega + eta * bmuf.delta if nesterov else bmuf.omega
        torch.testing.assert_close(outer.p, start, atol=1e-5, rtol=1e-5)
        buf = outer.optimizer.state[outer.p]["momentum_buffer"]
        torch.testing.assert_close(buf, -bmuf.delta / zeta, atol=1e-5, rtol=1e-5)
    assert float(local.abs().max()) > 1.0  # the filter moved far from theta0: not a trivial agreement


def test_outer_update_by_hand_and_in_place():
    slots = OuterSlots.start_from(t(1.0, 2.0), {"name": "SGD", "lr": 0.5})  # plain SGD, no momentum
    bar = t(2.0, 0.0)
    out = outer_update(bar, slots)
    # g = p - theta_bar = [-1, 2]; p = p - 0.5 g = [1.5, 1]
    assert torch.equal(out, t(1.5, 1.0)) and torch.equal(slots.p, t(1.5, 1.0))
    assert out.data_ptr() == bar.data_ptr() and out.data_ptr() != slots.p.data_ptr()
    assert slots.p.grad is None  # the gradient only borrowed theta_bar's buffer


def test_outer_slots_restart_and_warmup_end():
    slots = start_slots(t(1.0, 2.0), {"name": "Adam", "lr": 0.1})
    assert isinstance(slots, OuterSlots) and isinstance(start_slots(t(1.0)), BMUFSlots)
    new_local_model("sync", t(2.0, 3.0), slots, 0.0, 1.0, True)
    assert slots.optimizer.state[slots.p]  # Adam moments exist
    out = new_local_model("warmup_end", t(7.0, 8.0), slots, 0.0, 1.0, True)
    assert torch.equal(out, t(7.0, 8.0)) and torch.equal(slots.p, t(7.0, 8.0))
    assert not slots.optimizer.state  # a fresh optimizer (Algorithm 1, line 1)
    before = slots.p.clone()
    assert torch.equal(new_local_model("warmup", t(0.0, 0.0), slots, 0.0, 1.0, True), t(0.0, 0.0))
    assert torch.equal(slots.p, before)  # warm-up averages leave the slots alone


def test_outer_slots_state_round_trip_with_weights_only(tmp_path):
    spec = {"name": "Adam", "lr": 0.05, "betas": [0.8, 0.9]}
    a = OuterSlots.start_from(t(1.0, -1.0, 0.5), spec)
    b = OuterSlots.start_from(t(0.0, 0.0, 0.0), spec)
    for v in (0.5, -0.25, 1.0):
        outer_update(a.p + v, a)
    torch.save(a.state_dict(), tmp_path / "s.pt")
    b.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert torch.equal(a.p, b.p)
    for bar in (t(2.0, 0.0, 1.0), t(1.0, 1.0, 1.0)):
        torch.testing.assert_close(outer_update(bar.clone(), a), outer_update(bar.clone(), b), atol=0, rtol=0)
    assert len(a.tensors()) == 1 + 3  # p and Adam's step, exp_avg, exp_avg_sq
