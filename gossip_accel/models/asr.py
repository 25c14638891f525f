"""CTC acoustic models: spliced DNN, CLDNN, a small conformer, the ADPSGD papers' BLSTM, a TDNN.

All take features (B, T, D) with lengths and return CTC log-probabilities (B, T', V) and the
output lengths T'. 001_3db6b3ddf1f13045.txt (section 3) trains a 6x1024 ReLU DNN on 11
spliced frames and a CLDNN (1 CNN layer of 128 maps, 2 LSTM layers of 1024 cells with 512
projections, 2 DNN layers of 1024) with hybrid HMM targets; here the same shapes are trained
with CTC over BPE units, with frame subsampling so that the output rate suits word pieces.
Parameter names, for sync.components rules: ``frontend.*``, ``body.*`` (DNN layers / LSTM /
conformer blocks), ``dnn.*`` (CLDNN's DNN), ``output.*``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def splice(x: torch.Tensor, context: int) -> torch.Tensor:
    """Stack frames t-context..t+context (edges repeated): (B, T, D) -> (B, T, (2c+1)D)."""
    if context == 0:
        return x
    padded = torch.cat([x[:, :1].expand(-1, context, -1), x, x[:, -1:].expand(-1, context, -1)], dim=1)
    t = x.shape[1]
    return torch.cat([padded[:, i:i + t] for i in range(2 * context + 1)], dim=-1)


class SplicedDNN(nn.Module):
    """ReLU DNN on spliced frames, subsampled by ``subsample`` (the paper's 6x1024 on 11 frames)."""

    def __init__(self, input_dim: int, vocab_size: int, context: int = 5, hidden: int = 1024,
                 layers: int = 6, subsample: int = 3, dropout: float = 0.1):
        super().__init__()
        self.context, self.subsample = context, subsample
        dims = [input_dim * (2 * context + 1)] + [hidden] * layers
        self.body = nn.Sequential(*[m for i in range(layers)
                                    for m in (nn.Linear(dims[i], dims[i + 1]), nn.ReLU(), nn.Dropout(dropout))])
        self.output = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = splice(x, self.context)[:, ::self.subsample]
        out_lengths = (lengths + self.subsample - 1) // self.subsample
        return self.output(self.body(x)).log_softmax(-1), out_lengths


class CLDNN(nn.Module):
    """Conv (time x frequency) -> LSTMP layers -> DNN layers -> output (Sainath et al. 2015).

    The convolution has stride ``subsample`` in time, which sets the output frame rate.
    """

    def __init__(self, input_dim: int, vocab_size: int, conv_channels: int = 128, conv_kernel: int = 9,
                 subsample: int = 3, lstm_cells: int = 1024, lstm_proj: int = 512, lstm_layers: int = 2,
                 dnn_hidden: int = 1024, dnn_layers: int = 2, dropout: float = 0.1):
        super().__init__()
        self.subsample = subsample
        self.frontend = nn.Sequential(
            nn.Conv2d(1, conv_channels, kernel_size=(3, conv_kernel), stride=(subsample, 1), padding=(1, conv_kernel // 2)),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=(1, 3), stride=(1, 3)),
        )
        freq_out = input_dim // 3
        self.proj_in = nn.Linear(conv_channels * freq_out, lstm_cells)
        self.body = nn.LSTM(lstm_cells, lstm_cells, num_layers=lstm_layers, proj_size=lstm_proj,
                            batch_first=True, dropout=dropout if lstm_layers > 1 else 0.0)
        dims = [lstm_proj] + [dnn_hidden] * dnn_layers
        self.dnn = nn.Sequential(*[m for i in range(dnn_layers)
                                   for m in (nn.Linear(dims[i], dims[i + 1]), nn.ReLU(), nn.Dropout(dropout))])
        self.output = nn.Linear(dims[-1], vocab_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.frontend(x.unsqueeze(1))  # (B, C, T', F')
        b, c, t, f = h.shape
        h = self.proj_in(h.permute(0, 2, 1, 3).reshape(b, t, c * f))
        out_lengths = (lengths - 1) // self.subsample + 1
        packed = nn.utils.rnn.pack_padded_sequence(h, out_lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = self.body(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=t)
        return self.output(self.dnn(h)).log_softmax(-1), out_lengths


class ConformerCTC(nn.Module):
    """Conv2d subsampling (x4) + torchaudio's Conformer encoder + linear CTC output."""

    def __init__(self, input_dim: int, vocab_size: int, d_model: int = 144, num_heads: int = 4,
                 ffn_dim: int = 576, num_layers: int = 4, kernel_size: int = 15, dropout: float = 0.1):
        super().__init__()
        from torchaudio.models import Conformer

        self.frontend = nn.Sequential(
            nn.Conv2d(1, d_model, 3, stride=2), nn.ReLU(),
            nn.Conv2d(d_model, d_model, 3, stride=2), nn.ReLU(),
        )
        freq = ((input_dim - 1) // 2 - 1) // 2
        self.proj_in = nn.Linear(d_model * freq, d_model)
        self.body = Conformer(input_dim=d_model, num_heads=num_heads, ffn_dim=ffn_dim, num_layers=num_layers,
                              depthwise_conv_kernel_size=kernel_size, dropout=dropout)
        self.output = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.frontend(x.unsqueeze(1))
        b, c, t, f = h.shape
        h = self.proj_in(h.permute(0, 2, 1, 3).reshape(b, t, c * f))
        out_lengths = ((lengths - 1) // 2 - 1) // 2
        out_lengths = out_lengths.clamp(min=1, max=t)
        h, out_lengths = self.body(h, out_lengths)
        return self.output(h).log_softmax(-1), out_lengths


def stack_frames(x: torch.Tensor, lengths: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, D) frames -> (B, ceil(T/s), s*D): every s consecutive frames side by side (zero-padded at
    the end), the frame-rate reduction of the BLSTM and TDNN front ends; and the new lengths."""
    b, t, d = x.shape
    if t % s:
        x = torch.cat([x, x.new_zeros(b, s - t % s, d)], dim=1)
    return x.reshape(b, x.shape[1] // s, d * s), (lengths + s - 1) // s


class BLSTM(nn.Module):
    """Bidirectional LSTM -> linear bottleneck -> output: the acoustic model of the ADPSGD papers
    (002/004: 6 BLSTM layers of 512 cells per direction, bottleneck 256), here with CTC. Frames
    are stacked by ``subsample`` (concatenated) before the first layer, which sets the output rate.
    Parameter names: ``body.*`` (the BLSTM), ``bottleneck.*``, ``output.*``."""

    def __init__(self, input_dim: int, vocab_size: int, hidden: int = 512, layers: int = 6,
                 bottleneck: int = 256, subsample: int = 3, dropout: float = 0.1):
        super().__init__()
        self.subsample = subsample
        self.body = nn.LSTM(input_dim * subsample, hidden, num_layers=layers, bidirectional=True,
                            batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.bottleneck = nn.Linear(2 * hidden, bottleneck)
        self.output = nn.Linear(bottleneck, vocab_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, out_lengths = stack_frames(x, lengths, self.subsample)
        packed = nn.utils.rnn.pack_padded_sequence(x, out_lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = self.body(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return self.output(self.bottleneck(h)).log_softmax(-1), out_lengths


class TDNN(nn.Module):
    """Time-delay network (Peddinti et al. 2015) as 1-D convolutions with residual connections.

    Frames are stacked by ``subsample`` (as in :class:`BLSTM`), projected to ``hidden``, then
    ``layers`` blocks of Conv1d(kernel 3, dilation d) -> ReLU -> LayerNorm -> dropout, added to
    their input; ``dilations`` (cycled over the blocks) set the receptive field: 1,2,4 over 6
    blocks reach +-14 output frames, +-0.42 s at subsample 3, which a CTC over characters needs
    and a DNN on +-5 input frames lacks. Padded frames are zeroed after every block, so an
    utterance's output does not depend on the padding of its batch.
    Parameter names: ``frontend.*`` (the input projection), ``body.*`` (the blocks), ``output.*``."""

    def __init__(self, input_dim: int, vocab_size: int, hidden: int = 256, layers: int = 6,
                 subsample: int = 3, dilations: tuple[int, ...] = (1, 2, 4), dropout: float = 0.1):
        super().__init__()
        if not dilations or any(int(d) < 1 for d in dilations):
            raise ValueError(f"dilations={dilations!r}: give positive integers")
        self.subsample = subsample
        self.frontend = nn.Linear(input_dim * subsample, hidden)
        ds = [int(dilations[i % len(dilations)]) for i in range(layers)]
        self.body = nn.ModuleList(nn.Conv1d(hidden, hidden, 3, dilation=d, padding=d) for d in ds)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in ds)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, out_lengths = stack_frames(x, lengths, self.subsample)
        mask = (torch.arange(x.shape[1], device=x.device)[None, :] < out_lengths[:, None]).unsqueeze(-1).to(x.dtype)
        h = torch.relu(self.frontend(x)) * mask
        for conv, norm in zip(self.body, self.norms):
            y = torch.relu(conv(h.transpose(1, 2))).transpose(1, 2)
            h = (h + self.dropout(norm(y))) * mask
        return self.output(h).log_softmax(-1), out_lengths


MODELS = {"dnn": SplicedDNN, "cldnn": CLDNN, "conformer": ConformerCTC, "blstm": BLSTM, "tdnn": TDNN}


def build_acoustic_model(kind: str, input_dim: int, vocab_size: int, options: dict[str, Any]) -> nn.Module:
    if kind not in MODELS:
        raise ValueError(f"model.type={kind!r}; choose one of {sorted(MODELS)}")
    try:
        return MODELS[kind](input_dim, vocab_size, **options)
    except TypeError as e:
        raise ValueError(f"model.{kind}: {e}") from e
