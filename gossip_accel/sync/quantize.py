"""The int8/int4 wire (``sync.exchange_dtype: int8 | int4``): per-block absmax quantization with error feedback.

Shared by the transport (:mod:`gossip_accel.sync.comm`, :mod:`gossip_accel.sync.engines.coded`) and the oracle
(:mod:`gossip_accel.sync.simulate`): every encode, decode and residual update of a run goes through the
functions below, so the simulator rounds exactly where and how the workers do.

Quantizer (symmetric, per block of B = ``sync.quant_block`` consecutive elements, b bits, q_max = 2^(b-1) - 1):

    s_j  = fl_s( max_{i in block j} |x_i| / q_max )            (fl_s: ``sync.quant_scale_dtype``)
    c_i  = clamp( round(x_i / s_j), -q_max, q_max )             (0 where s_j = 0)
    D(Q(x))_i = c_i s_j,    |x_i - D(Q(x))_i| <= s_j / 2        (fp32 scales)

bf16 scales (fp32's range, 8 significant bits; fp16's range would make the scales of small outer gradients
subnormal) round s_j by at most 2^-9 relative, which adds q_max |s - fl_s(s)| <= q_max 2^-9 s_j to the error of
a block's largest elements (their codes clamp at q_max).

int8 codes are stored one per byte, int4 codes two per byte (c + 8 in a nibble, low nibble first); the
payload of L elements is the codes followed by the ceil(L / B) scales: ``Codec.payload_bytes(L)`` bytes,
the only thing that travels and the only thing the byte counters count.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019, Algorithm 2): a sender keeps the residual e of
what it failed to send and adds it to the next message:

    v = x + e,   send Q(v),   e <- v - D(Q(v))                  (:func:`compress_`)

so the sum of everything received tracks the sum of everything meant to be sent within one residual:
sum_t D(Q(v_t)) = sum_t x_t - e_T.

Public copies (CHOCO-SGD, Koloskova et al. 2019, arXiv 1902.00340, eq. 2 / Algorithm 1 line 5-7, per edge):
a sender i and a receiver k hold the same copy hat of theta_i; a message is the quantized difference, and
both sides add it to the copy:

    hat <- hat + D(Q(theta_i - hat))                             (:func:`send_to_copy_`, :func:`apply_to_copy_`)

the copy is within one quantization step of theta_i, and theta_i - hat is carried to the next message.
A gossip round is :func:`ring_send` at the senders and :func:`ring_receive` at the receivers; an overlapped
sync (``sync.overlap_steps`` = tau) calls the first at its post step t and the second at t + tau.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .health import finite

#: ``sync.exchange_dtype`` values of the quantized wire and their bits per code
QUANT_BITS = {"int8": 8, "int4": 4}
#: ``sync.quant_scale_dtype`` values and their torch dtypes
SCALE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Codec:
    """The quantizer of the module docstring: ``bits`` per code, ``block`` elements per scale."""

    bits: int
    block: int
    scale_dtype: torch.dtype = torch.float32

    @property
    def qmax(self) -> int:
        """The largest code magnitude: 127 (int8), 7 (int4)."""
        return 2 ** (self.bits - 1) - 1

    def value_bytes(self, length: int) -> int:
        """Bytes of the codes of ``length`` elements (int4: two per byte)."""
        return length if self.bits == 8 else (length + 1) // 2

    def scale_count(self, length: int) -> int:
        return -(-length // self.block)

    def payload_bytes(self, length: int) -> int:
        """Bytes on the wire for ``length`` elements: codes + scales."""
        return self.value_bytes(length) + self.scale_count(length) * torch.finfo(self.scale_dtype).bits // 8

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Q(x) of each row of ``x`` (rows, L) fp32: a uint8 tensor (rows, payload_bytes(L)).

        One division, one rounding and one packing pass over the codes: the clamp to +-q_max and the NaN
        handling run only when a block is non-finite or its scale subnormal (a finite block's |x_i / s_j| is
        at most q_max (1 + 2^-8) < q_max + 1/2 with fp32 or bf16 scales, so its codes round into range)."""
        codes, scale, _, _ = self._codes(x)
        return self._pack(codes, scale, x.shape[1])

    def encode_decoded(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q(x), D(Q(x))): the payload of :meth:`encode` and the fp32 rows (rows, L) that :meth:`decode` makes of
        it, taken from the codes before packing (c_i s_j, the same product decode forms; a zero may keep the sign
        of the value it rounded from) instead of unpacking them again: what a sender that applies its own message
        (error feedback, a public copy) needs."""
        payload, decoded, _ = self.encode_decoded_finite(x)
        return payload, decoded

    def encode_decoded_finite(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """:meth:`encode_decoded` and whether every element of ``x`` was finite (read off the block maxima the
        scales come from: a block holding an inf or a NaN has a non-finite one), at no extra pass."""
        codes, scale, s, finite_x = self._codes(x)
        payload = self._pack(codes, scale, x.shape[1])
        rows, full = codes.shape
        codes.view(rows, -1, self.block).mul_(s.unsqueeze(-1))
        return payload, codes[:, :x.shape[1]], finite_x

    def _codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """The codes c (rows, nb B) fp32, zero past L, the scales in the scale dtype and as fp32 (rows, nb), and
        whether x was finite. The whole blocks are read where they lie; only a last, partial block is handled
        apart (no zero-padded copy of x)."""
        x = x if x.dtype == torch.float32 else x.float()
        rows, length = x.shape
        nb, whole = self.scale_count(length), length // self.block
        full, main = nb * self.block, whole * self.block
        body, tail = x[:, :main].view(rows, whole, self.block), x[:, main:]
        absmax = torch.empty(rows, nb, dtype=torch.float32, device=x.device)  # NaN where a block holds one
        torch.maximum(body.amax(-1), body.amin(-1).neg_(), out=absmax[:, :whole])
        if main < length:
            absmax[:, whole] = torch.maximum(tail.amax(-1), tail.amin(-1).neg_())
        absmax.abs_()  # +0 for a block of zeros (maximum(-0, +0) is -0 on the CPU, +0 on CUDA)
        # a true division by a tensor: CUDA divides by a scalar as a multiplication by its reciprocal (another rounding)
        scale = torch.div(absmax, torch.full_like(absmax, self.qmax))
        scale = scale.clamp_(max=torch.finfo(self.scale_dtype).max).to(self.scale_dtype)
        finite_x = bool(torch.isfinite(absmax).all())
        if not finite_x:  # one NaN's bits on every device (CPU and CUDA kernels leave different NaN payloads)
            scale.masked_fill_(scale.isnan(), float("nan"))
        s = scale.float()
        in_range = finite_x and not bool(((s > 0) & (s < _TINY)).any())
        # s = 0 (an all-zero block) or NaN divides by inf: code 0, as every element of a NaN block
        divisor = torch.where(s > 0, s, torch.inf).unsqueeze(-1)
        codes = torch.empty(rows, full, dtype=torch.float32, device=x.device)
        torch.div(body, divisor[:, :whole], out=codes[:, :main].view(rows, whole, self.block))
        if main < length:
            torch.div(tail, divisor[:, whole], out=codes[:, main:length])
            codes[:, length:].zero_()
        if in_range:
            codes.round_()
        else:
            codes.nan_to_num_(0.0).round_().clamp_(-self.qmax, self.qmax)
        return codes, scale, s, finite_x

    def _pack(self, codes: torch.Tensor, scale: torch.Tensor, length: int) -> torch.Tensor:
        """The payload of the codes of L elements and their scales, in one fresh buffer: codes (int8: a byte
        each, int4: two per byte) followed by the scales' bytes."""
        vb = self.value_bytes(length)
        payload = torch.empty(codes.shape[0], self.payload_bytes(length), dtype=torch.uint8, device=codes.device)
        if self.bits == 8:
            payload[:, :vb].view(torch.int8).copy_(codes[:, :length])  # integral codes: the conversion is exact
        else:
            _nibbles(codes, vb, out=payload[:, :vb])
        payload[:, vb:].copy_(scale.contiguous().view(torch.uint8))
        return payload

    def decode(self, payload: torch.Tensor, length: int) -> torch.Tensor:
        """D(Q(x)): the fp32 rows (rows, ``length``) of a payload made by :meth:`encode`."""
        rows = payload.shape[0]
        vb = self.value_bytes(length)
        values = payload[:, :vb]
        # a fresh flat copy: viewing bytes as floats needs an aligned start and stride
        scale = payload[:, vb:].reshape(-1).clone().view(self.scale_dtype).view(rows, -1).float()
        nb = scale.shape[1]
        full = nb * self.block
        width = max(full, 2 * vb) if self.bits == 4 else full
        out = torch.empty(rows, width, dtype=torch.float32, device=payload.device)
        if self.bits == 8:
            out[:, :length] = values.view(torch.int8)
        else:  # low nibble first, each c + 8
            pairs = out[:, :2 * vb].view(rows, vb, 2)
            pairs[..., 0].copy_(values & 15)
            pairs[..., 1].copy_(values >> 4)
            out[:, :2 * vb].sub_(8)
        out[:, length:].zero_()
        out[:, :full].view(rows, nb, self.block).mul_(scale.unsqueeze(-1))  # a view even when width > full
        return out[:, :length]


#: the smallest normal fp32 (and bf16) scale: below it a scale loses relative precision
_TINY = torch.finfo(torch.float32).tiny


def _nibbles(codes: torch.Tensor, nbytes: int, out: torch.Tensor) -> torch.Tensor:
    """The first ``nbytes`` bytes of int4 codes (rows, width; integral fp32, codes past L 0) into ``out``, two
    per byte, low nibble first: (c_lo + 8) + 16 (c_hi + 8), formed in bytes (the codes' two's complement bytes
    give c_lo + 16 c_hi + 136 modulo 256, which is that byte: it lies in 0..255)."""
    rows, width = codes.shape[0], min(codes.shape[1], 2 * nbytes)
    c8 = torch.empty(rows, 2 * nbytes, dtype=torch.int8, device=codes.device)
    c8[:, :width].copy_(codes[:, :width])  # integral codes: the conversion is exact
    c8[:, width:].zero_()  # an odd block and an odd number of blocks: one more code 0
    pairs = c8.view(torch.uint8).view(rows, nbytes, 2)
    return torch.add(pairs[..., 0], pairs[..., 1], alpha=16, out=out).add_(136)


def _restart_nonfinite_(t: torch.Tensor) -> bool:
    """Non-finite entries of a residual or public copy restart at 0 (in place; a finite tensor, the usual
    case, is only read once, by :func:`~gossip_accel.sync.health.finite`); returns whether any did."""
    if finite(t):
        return False
    t.nan_to_num_(0.0, 0.0, 0.0)
    return True


def codec_of(cfg) -> Optional[Codec]:
    """The :class:`Codec` of a :class:`~gossip_accel.sync.config.SyncConfig`; None for a float wire."""
    bits = QUANT_BITS.get(cfg.exchange_dtype)
    return None if bits is None else Codec(bits, cfg.quant_block, SCALE_DTYPES[cfg.quant_scale_dtype])


def compress_(codec: Codec, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """Error feedback: v = x + e, returns Q(v) and sets e <- v - D(Q(v)) (rows of ``x``, in place in
    ``residual``). A non-finite residual entry (a diverged sender) restarts at 0."""
    v = x + residual
    payload, sent = codec.encode_decoded(v)
    torch.sub(v, sent, out=residual)
    _restart_nonfinite_(residual)
    return payload


def apply_to_copy_(codec: Codec, copy: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    """A public copy (1-D) <- copy + D(payload), in place; a copy left non-finite by the previous message
    restarts at 0 first (both ends of the edge do the same, so they stay equal)."""
    _restart_nonfinite_(copy)
    return copy.add_(codec.decode(payload, copy.numel())[0])


def send_to_copy_(codec: Codec, theta: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
    """The sender's side of an edge: returns Q(theta - hat) and applies it to its copy hat (1-D, in place).
    A non-finite hat restarts at 0 first (:func:`_restart_nonfinite_`); a finite difference theta - hat proves
    hat finite (an inf or NaN in hat would be one in the difference), so its own test runs only when the
    difference is not finite, and the message is coded again after a restart."""
    payload, sent, finite_diff = codec.encode_decoded_finite((theta - copy).unsqueeze(0))
    if not finite_diff and _restart_nonfinite_(copy):
        payload, sent = codec.encode_decoded((theta - copy).unsqueeze(0))
    copy.add_(sent[0])  # = apply_to_copy_(codec, copy, payload), without unpacking the payload again
    return payload


# -- the ring: one worker's messages of a gossip round and what its receivers make of them -------------------------
def ring_send(codec: Codec, theta: torch.Tensor, state: dict[str, torch.Tensor], send_to: Sequence[int],
              scheme: str) -> list[torch.Tensor]:
    """Worker i's payloads of a gossip round, coded from ``theta`` (1-D; theta_t of the post step when the
    exchange is overlapped): ``copies``: Q(theta - sent.j) for each receiver j of ``send_to``, the sender's
    copy sent.j updated now (:func:`send_to_copy_`); ``params``: one Q(theta + e) for all of them, the
    residual ``ring_residual`` updated now (:func:`compress_`; no message, no update, when no one pulls)."""
    if scheme == "copies":
        return [send_to_copy_(codec, theta, state[f"sent.{dst}"]) for dst in send_to]
    return [compress_(codec, theta.unsqueeze(0), state["ring_residual"])] if send_to else []


def ring_receive(codec: Codec, state: dict[str, torch.Tensor], recv_from: Sequence[int],
                 payloads: Sequence[torch.Tensor], numel: int, scheme: str) -> list[torch.Tensor]:
    """Worker k's fp32 copies of the neighbours ``recv_from`` from their ``payloads`` (same order), when the
    messages are applied (the post step, or t + tau overlapped): ``copies``: copy.j <- copy.j + D(payload)
    (:func:`apply_to_copy_`; the state tensors themselves are returned), ``params``: D(payload)."""
    if scheme == "copies":
        return [apply_to_copy_(codec, state[f"copy.{src}"], p.reshape(1, -1)) for src, p in zip(recv_from, payloads)]
    return [codec.decode(p.reshape(1, -1), numel)[0] for p in payloads]


# -- the all-reduce family: a quantized reduce-scatter + all-gather of the outer gradient -----------------------
def chunk_length(numel: int, n: int) -> int:
    """Elements per rank's chunk of the reduce-scatter: ceil(numel / n) (the buffer is zero-padded to n chunks)."""
    return -(-numel // n)


def allreduce_bytes(codec: Codec, numel: int, n: int) -> int:
    """Bytes one rank sends (and receives) in :func:`coded_send` + :func:`owner_reduce_` + all-gather:
    2 (n - 1) chunk payloads."""
    return 2 * (n - 1) * codec.payload_bytes(chunk_length(numel, n)) if n > 1 else 0


def as_rows(delta: torch.Tensor, n: int) -> torch.Tensor:
    """The flat ``delta`` as (n, chunk) rows, zero-padded: row j goes to the owner of chunk j."""
    chunk = chunk_length(delta.numel(), n)
    rows = torch.zeros(n * chunk, dtype=torch.float32, device=delta.device)
    rows[:delta.numel()] = delta.reshape(-1)
    return rows.view(n, chunk)


def coded_send(codec: Codec, delta: torch.Tensor, residual: torch.Tensor, n: int, sick: bool = False) -> torch.Tensor:
    """A worker's reduce-scatter payload (n rows): Q(delta_i + e_i) chunk by chunk with error feedback
    (``residual``: (n, chunk)); a sick worker sends zeros and keeps its residual."""
    rows = as_rows(delta, n)
    if sick:
        return codec.encode(torch.zeros_like(rows))
    return compress_(codec, rows, residual)


def owner_reduce_(codec: Codec, received: Sequence[torch.Tensor], chunk: int, residual: torch.Tensor) -> torch.Tensor:
    """The owner of a chunk: m = (1/n) sum_k D(Q_k) in fp32 in rank order, returns Q(m + e_o) with its own
    error feedback (``residual``: (1, chunk)) for the all-gather."""
    mean = codec.decode(received[0], chunk)
    for payload in received[1:]:
        mean.add_(codec.decode(payload, chunk))
    return compress_(codec, mean.div_(len(received)), residual)


def gathered_mean(codec: Codec, gathered: torch.Tensor, chunk: int, numel: int) -> torch.Tensor:
    """The mean outer gradient every rank decodes from the all-gathered owner payloads (n rows)."""
    return codec.decode(gathered, chunk).reshape(-1)[:numel]


def simulated_coded_mean(codec: Codec, deltas: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                         owner_residuals: Sequence[torch.Tensor], sick: Sequence[bool]) -> torch.Tensor:
    """The oracle of ``Communicator.allreduce_mean_coded`` for all n workers at once: the same payloads,
    the same owner sums, the same decode (updates every worker's and owner's residual in place)."""
    n, numel = len(deltas), deltas[0].numel()
    chunk = chunk_length(numel, n)
    sent = [coded_send(codec, d, r, n, s) for d, r, s in zip(deltas, residuals, sick)]
    owners = [owner_reduce_(codec, [sent[k][j:j + 1] for k in range(n)], chunk, owner_residuals[j]) for j in range(n)]
    return gathered_mean(codec, torch.cat(owners, 0), chunk, numel)


def coded_state(theta0: torch.Tensor, n: int, neighbours: Optional[Sequence[int]], ring_scheme: str,
                full: bool = True) -> dict[str, torch.Tensor]:
    """What one worker keeps for one component (N elements) on the int8/int4 wire, started at theta_0:

    * ``ref`` (N): the model every rank started the block from (the full graph's shared reference);
      ``residual`` (n x ceil(N/n)) its error feedback, ``owner`` (ceil(N/n)) that of the chunk it owns
      (only with ``full``: a ring run without warm-up has no full average);
    * ring, ``copies``: ``sent.j`` (N) = neighbour j's copy of this worker, ``copy.j`` (N) = its copy of j,
      for each of the 2p ring neighbours; ring, ``params``: ``ring_residual`` (N).
    """
    theta0 = theta0.detach().clone()
    chunk = chunk_length(theta0.numel(), n)
    state = {"ref": theta0, "residual": theta0.new_zeros(n, chunk), "owner": theta0.new_zeros(1, chunk)} if full else {}
    if neighbours is not None and ring_scheme == "copies":
        for j in neighbours:
            state[f"sent.{j}"] = theta0.clone()
            state[f"copy.{j}"] = theta0.clone()
    elif neighbours is not None:
        state["ring_residual"] = theta0.new_zeros(1, theta0.numel())
    return state
