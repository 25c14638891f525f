"""Bad input everywhere (issue 9): one table of bad inputs, each through the entry point a user
runs (the bin/ modules' main(), utils/*.sh, the config loaders). Every case checks

* the exit code / error class,
* that the message names the file and the line (or the key) and says what to do,
* that outputs an earlier run made are byte-identical after the failed run,
* that no traceback reaches the user of a CLI.

docs/RELIABILITY.md keeps the table (input, where, what the user gets, test id) in step with
CASES below. The second half of the file is the safety audit: rules that hold repo-wide
(no unsafe loads, no eval/exec, no shell=True, no unquoted paths in our shell scripts).
"""
from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import soundfile as sf

from gossip_accel.bin import compute_cmvn, compute_fbank, decode_asr, fix_data_dir, prepare_lm, score_wer, train_units
from gossip_accel.bin import units_text
from gossip_accel.bin import validate_data_dir
from gossip_accel.sync.config import ConfigError, load_sync_config
from gossip_accel.data import kaldi as kd

ROOT = Path(__file__).resolve().parent.parent
RATE = 16000


# ------------------------------------------------------------------------------------------ fixtures

def tone(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


def make_data_dir(root: Path, audio_name: str = "audio", n: int = 3) -> Path:
    """A valid data dir ``root/data``: n utterances of speaker spk1, real 16 kHz WAV files in
    ``root/<audio_name>`` (a name that may hold spaces and quotes)."""
    d, audio = root / "data", root / audio_name
    d.mkdir(parents=True)
    audio.mkdir(parents=True, exist_ok=True)
    wav, text, u2s = {}, {}, {}
    for i in range(n):
        u = f"spk1-u{i}"
        p = audio / f"{u}.wav"
        sf.write(p, tone(0.2 + 0.05 * i, i), RATE, subtype="PCM_16")
        wav[u], text[u], u2s[u] = str(p), f"HELLO WORLD {i}", "spk1"
    kd.write_wav_scp(d / "wav.scp", wav)
    kd.write_text(d / "text", text)
    kd.write_utt2spk(d / "utt2spk", u2s)
    kd.write_spk2utt(d / "spk2utt", kd.utt2spk_to_spk2utt(u2s))
    return d


def replace_line(path: Path, lineno: int, new: bytes | None) -> None:
    """Replace (None: delete) line ``lineno`` (1-based) of a file, byte-exact otherwise."""
    lines = path.read_bytes().split(b"\n")
    if new is None:
        del lines[lineno - 1]
    else:
        lines[lineno - 1] = new
    path.write_bytes(b"\n".join(lines))


def with_features(root: Path) -> tuple[Path, Path]:
    """A data dir with features computed (the outputs a failed rerun must keep)."""
    d = make_data_dir(root)
    fb = root / "fbank"
    compute_fbank.main(["--data", str(d), "--out", str(fb), "--no-progress"])
    return d, fb


def snapshot(*paths: Path) -> dict[Path, bytes]:
    """Bytes of every file under the given paths (files or dirs)."""
    out = {}
    for p in paths:
        for f in ([p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())):
            out[f] = f.read_bytes()
    return out


def run_cli(main: Callable, argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, everything the user saw on stderr) of a bin/ module's main()."""
    try:
        rc = main(argv) or 0
        msg = ""
    except SystemExit as e:
        rc, msg = (1, e.code) if isinstance(e.code, str) else (e.code or 0, "")
    err = capsys.readouterr().err
    err = "\n".join(x for x in re.split(r"[\r\n]", err) if x.strip() and not _PROGRESS.match(x))  # tqdm bars
    return rc, (msg + "\n" + err).strip()


_PROGRESS = re.compile(r"^[\w ]+:\s+\d+%\|")


# ------------------------------------------------------------------------------------------ the table

@dataclass
class Case:
    """One bad input: ``setup(tmp) -> (main, argv, protected paths)``; the run must exit with
    ``code`` and a message matching every regex of ``says``."""

    setup: Callable
    says: list[str]
    code: int = 1
    one_line: bool = True          # the CLI's error is one line (validate_data_dir lists every problem)


def dd(edit: Callable[[Path], None], check: str = "validate") -> Callable:
    """A data-dir case: make a valid dir, apply ``edit``, run validate_data_dir (or fix_data_dir)."""
    def setup(tmp: Path):
        d = make_data_dir(tmp)
        edit(d)
        if check == "validate":
            return validate_data_dir.main, [str(d)], [d]
        return fix_data_dir.main, [str(d)], [d]
    return setup


def fbank_after(edit: Callable[[Path], None], *flags: str) -> Callable:
    """compute_fbank on a dir that already has features, after ``edit`` broke its audio."""
    def setup(tmp: Path):
        d, fb = with_features(tmp)
        edit(d)
        return compute_fbank.main, ["--data", str(d), "--out", str(fb), "--no-progress", *flags], \
            [d / "feats.scp", d / "utt2num_frames", fb]
    return setup


def set_wav(utt_index: int, value: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        replace_line(d / "wav.scp", utt_index + 1, f"spk1-u{utt_index} {value}".encode())
    return edit


def bad_audio(kind: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = Path(kd.read_wav_scp(d / "wav.scp")["spk1-u1"])
        if kind == "garbage":
            p.write_bytes(b"RIFF\x00\x01garbage" * 8)
        elif kind == "zero-length":
            sf.write(p, np.zeros(0, dtype=np.int16), RATE, subtype="PCM_16")
        elif kind == "empty-file":
            p.write_bytes(b"")
        elif kind == "directory":
            p.unlink()
            p.mkdir()
    return edit


def lm_src(tmp: Path, train: bytes, valid: bytes = b"a b c\n") -> tuple[Path, Path]:
    """An LM source dir and an existing LM data dir prepared from good text."""
    good, src, out = tmp / "good", tmp / "src", tmp / "lm"
    for d, t, v in ((good, b"the cat sat\nthe dog ran\n", b"a b c\n"), (src, train, valid)):
        d.mkdir()
        (d / "wiki.train.tokens").write_bytes(t)
        (d / "wiki.valid.tokens").write_bytes(v)
    prepare_lm.main(["--src", str(good), "--out", str(out)])
    return src, out


def prepare_lm_case(train: bytes, valid: bytes = b"a b c\n") -> Callable:
    def setup(tmp: Path):
        src, out = lm_src(tmp, train, valid)
        return prepare_lm.main, ["--src", str(src), "--out", str(out)], [out]
    return setup


def lang_dir(tmp: Path) -> Path:
    (tmp / "t").write_text("u1 HELLO WORLD\nu2 GOOD MORNING\nu3 HELLO AGAIN\n")
    train_units.main(["--text", str(tmp / "t"), "--lang-dir", str(tmp / "lang"), "--unit-type", "char"])
    return tmp / "lang"


def units_text_case(kind: str) -> Callable:
    def setup(tmp: Path):
        lang = lang_dir(tmp)
        out = tmp / "lm" / "units.txt"
        units_text.main(["--lang-dir", str(lang), "--text", str(tmp / "t"), "--out", str(out)])
        text = tmp / "t"
        if kind == "missing-model":
            lang = tmp / "no_lang"
        elif kind == "corrupt-model":
            (lang / "bpe.model").write_bytes(b"not a model")
        elif kind == "non-utf8":
            text = tmp / "t2"
            text.write_bytes(b"u1 HELLO\nu2 CAF\xe9\n")
        return units_text.main, ["--lang-dir", str(lang), "--text", str(text), "--out", str(out)], [out]
    return setup


def train_units_case(text: bytes | None) -> Callable:
    def setup(tmp: Path):
        lang = lang_dir(tmp)
        t = tmp / "bad_text"
        if text is not None:
            t.write_bytes(text)
        return train_units.main, ["--text", str(t), "--lang-dir", str(lang), "--unit-type", "char"], [lang]
    return setup


def cmvn_case(kind: str) -> Callable:
    def setup(tmp: Path):
        d, fb = with_features(tmp)
        compute_cmvn.main(["--data", str(d)])
        if kind == "pipe":
            marker = tmp / "RAN"
            replace_line(d / "feats.scp", 2, f"spk1-u1 touch '{marker}'; cat x |".encode())
        elif kind == "missing-ark":
            (fb / "raw_fbank.1.ark").rename(fb / "moved.ark")
        elif kind == "non-utf8":
            replace_line(d / "feats.scp", 2, b"spk1-u1 caf\xe9.ark:12")
        return compute_cmvn.main, ["--data", str(d)], [d / "cmvn.ark"]
    return setup


def decode_case(kind: str) -> Callable:
    """decode_asr on an exp dir whose final.pt is not the model its config.yaml builds, or whose
    data dir has a feats.scp command."""
    def setup(tmp: Path):
        import torch
        from omegaconf import OmegaConf

        d, _ = with_features(tmp)
        compute_cmvn.main(["--data", str(d)])
        (tmp / "t").write_text("u1 HELLO WORLD\n")
        train_units.main(["--text", str(tmp / "t"), "--lang-dir", str(tmp / "lang"), "--unit-type", "char"])
        exp = tmp / "exp"
        exp.mkdir()
        OmegaConf.save({"data": {"train": str(d), "lang": str(tmp / "lang")}, "model": {"type": "dnn"}},
                       exp / "config.yaml")
        torch.save(torch.nn.Linear(3, 2).state_dict(), exp / "final.pt")   # another model's weights
        if kind == "feats-pipe":
            replace_line(d / "feats.scp", 1, f"spk1-u0 touch '{tmp}/RAN' |".encode())
        out = tmp / "decode"
        return decode_asr.main, ["--exp-dir", str(exp), "--data", str(d), "--out", str(out)], [exp, d]
    return setup


def score_case(hyp: bytes) -> Callable:
    def setup(tmp: Path):
        (tmp / "ref").write_text("u1 A B\nu2 C\n")
        (tmp / "hyp").write_bytes(hyp)
        return score_wer.main, ["--ref", str(tmp / "ref"), "--hyp", str(tmp / "hyp"), "--out-dir", str(tmp / "s")], \
            [tmp / "ref"]
    return setup


def sync_yaml(body: str | bytes) -> Callable:
    """load_sync_config on a YAML file (the sync section of a recipe's config)."""
    def setup(tmp: Path):
        p = tmp / "conf" / "sync.yaml"
        p.parent.mkdir()
        p.write_bytes(body if isinstance(body, bytes) else body.encode())
        return load_sync_config, p, [p]
    return setup


def structured_yaml(body: str) -> Callable:
    """train.config.load_structured (the train/model/data sections) on a YAML file."""
    def setup(tmp: Path):
        p = tmp / "conf" / "train.yaml"
        p.parent.mkdir()
        p.write_text(body)
        return "structured", p, [p]
    return setup


def components_case(rules: list[dict]) -> Callable:
    def setup(tmp: Path):
        return "components", rules, []
    return setup


CASES: dict[str, Case] = {
    # ---------------------------------------------------------------- data dirs: validate_data_dir
    "dd-missing-file": Case(dd(lambda d: (d / "text").unlink()), [r"data/text: missing"], one_line=False),
    "dd-unsorted-keys": Case(dd(lambda d: (d / "text").write_text("spk1-u1 B\nspk1-u0 A\nspk1-u2 C\n")),
                             [r"data/text:2: not sorted: spk1-u0 after spk1-u1", r"sort"], one_line=False),
    "dd-duplicated-keys": Case(dd(lambda d: (d / "utt2spk").write_text("spk1-u0 spk1\nspk1-u0 spk1\nspk1-u1 spk1\n"
                                                                       "spk1-u2 spk1\n")),
                               [r"data/utt2spk:2: duplicate key spk1-u0 \(first on line 1\)"], one_line=False),
    "dd-text-utt2spk-mismatch": Case(dd(lambda d: replace_line(d / "text", 2, None)),
                                     [r"data/utt2spk:2: utterance spk1-u1 has no entry in text",
                                      r"fix_data_dir"], one_line=False),
    "dd-empty-transcript": Case(dd(lambda d: replace_line(d / "text", 3, b"spk1-u2")),
                                [r"data/text:3: empty transcript for spk1-u2"], one_line=False),
    "dd-non-utf8-text": Case(dd(lambda d: replace_line(d / "text", 2, b"spk1-u1 CAF\xe9")),
                             [r"data/text:2: not UTF-8 \(byte 0xe9\)"], one_line=False),
    "dd-missing-audio": Case(dd(lambda d: set_wav(1, "/nonexistent/x.wav")(d)),
                             [r"data/wav.scp:2: spk1-u1: file not found: /nonexistent/x.wav"], one_line=False),
    "dd-not-a-dir": Case(lambda tmp: (validate_data_dir.main, [str(tmp / "nope")], []), [r"nope: not a directory"],
                         one_line=False),
    # ---------------------------------------------------------------- data dirs: fix_data_dir
    "fix-non-utf8-untouched": Case(dd(lambda d: replace_line(d / "utt2spk", 2, b"spk1-u1 sp\xff"), check="fix"),
                                   [r"data/utt2spk:2: not UTF-8"]),
    "fix-nothing-left": Case(dd(lambda d: [set_wav(i, f"/nonexistent/{i}.wav")(d) for i in range(3)], check="fix"),
                             [r"data: every utterance would be dropped \(3 of 3\) \(first: spk1-u0: audio file not found: /nonexistent/0.wav\); nothing was changed"]),
    # ---------------------------------------------------------------- audio: compute_fbank
    "fbank-wav-pipe-refused": Case(fbank_after(lambda d: set_wav(1, f"touch '{d}/RAN'; cat x.wav |")(d)),
                                   [r"data/wav.scp:2: spk1-u1: .* is a shell command", r"--allow-pipes"]),
    "fbank-garbage-audio": Case(fbank_after(bad_audio("garbage")),
                                [r"data/wav.scp: utterance spk1-u1: cannot read audio .*spk1-u1.wav"]),
    "fbank-zero-length-audio": Case(fbank_after(bad_audio("zero-length")),
                                    [r"data/wav.scp: utterance spk1-u1: .*spk1-u1.wav.* has no samples"]),
    "fbank-empty-file": Case(fbank_after(bad_audio("empty-file")),
                             [r"data/wav.scp: utterance spk1-u1: cannot read audio .*spk1-u1.wav"]),
    "fbank-audio-is-a-directory": Case(fbank_after(bad_audio("directory")),
                                       [r"data/wav.scp: utterance spk1-u1: is a directory, not an audio file"]),
    "fbank-missing-audio": Case(fbank_after(set_wav(2, "/nonexistent/y.wav")),
                                [r"data/wav.scp: utterance spk1-u2: audio file not found: '/nonexistent/y.wav'"]),
    "fbank-non-utf8-wav-scp": Case(fbank_after(lambda d: replace_line(d / "wav.scp", 3, b"spk1-u2 /x/\xff.wav")),
                                   [r"data/wav.scp:3: not UTF-8"]),
    "fbank-duplicate-key": Case(fbank_after(lambda d: replace_line(d / "wav.scp", 2, b"spk1-u0 /x.wav")),
                                [r"data/wav.scp:2: duplicate key spk1-u0 \(first on line 1\)"]),
    "fbank-out-with-comma": Case(lambda tmp: (compute_fbank.main, ["--data", str(make_data_dir(tmp)), "--out",
                                                                   str(tmp / "a,b"), "--no-progress"], []),
                                 [r"--out .*a,b: a path with ',' cannot be written in a Kaldi wspecifier"]),
    "fbank-no-wav-scp": Case(fbank_after(lambda d: (d / "wav.scp").unlink()), [r"data/wav.scp not found"]),
    # ---------------------------------------------------------------- features: compute_cmvn
    "cmvn-feats-pipe-refused": Case(cmvn_case("pipe"), [r"feats.scp:2: spk1-u1: .* is a shell command",
                                                        r"compute_fbank"]),
    "cmvn-missing-ark": Case(cmvn_case("missing-ark"), [r"feats.scp: cannot load features of spk1-u0 .*raw_fbank.1.ark"]),
    "cmvn-non-utf8-feats-scp": Case(cmvn_case("non-utf8"), [r"feats.scp:2: not UTF-8"]),
    # ---------------------------------------------------------------- LM text: prepare_lm
    "lm-empty-train": Case(prepare_lm_case(b""), [r"src/wiki.train.tokens: no tokens", r"left unchanged"]),
    "lm-blank-train": Case(prepare_lm_case(b"\n  \n\n"), [r"src/wiki.train.tokens: no tokens"]),
    "lm-non-utf8-line": Case(prepare_lm_case(b"good line\nanother\nbad \xff line\n"),
                             [r"src/wiki.train.tokens:3: not UTF-8 \(byte 0xff at column 5\)", r"iconv"]),
    "lm-non-utf8-valid": Case(prepare_lm_case(b"fine\n", b"ok\n\xc3\n"), [r"src/wiki.valid.tokens:2: not UTF-8"]),
    "lm-missing-split": Case(lambda tmp: (prepare_lm.main, ["--src", str(tmp), "--out", str(tmp / "o")], []),
                             [r"lacks wiki.train.tokens, wiki.valid.tokens"]),
    # ---------------------------------------------------------------- units
    "units-model-missing": Case(units_text_case("missing-model"), [r"no_lang/bpe.model not found", r"train_units"]),
    "units-model-corrupt": Case(units_text_case("corrupt-model"), [r"lang/bpe.model: not a sentencepiece model",
                                                                   r"train_units"]),
    "units-text-non-utf8": Case(units_text_case("non-utf8"), [r"t2:2: not UTF-8"]),
    "train-units-no-text": Case(train_units_case(None), [r"bad_text not found"]),
    "train-units-empty-transcripts": Case(train_units_case(b"u1\nu2   \n"), [r"bad_text: no non-empty transcripts"]),
    # ---------------------------------------------------------------- decoding and scoring
    "decode-checkpoint-of-another-model": Case(decode_case("other-model"),
                                               [r"exp/final.pt does not fit the model of .*exp/config.yaml",
                                                r"decode with the config it was trained with"]),
    "decode-feats-pipe-refused": Case(decode_case("feats-pipe"), [r"data/feats.scp:1: spk1-u0: .* is a shell command"]),
    "score-hyp-duplicate-key": Case(score_case(b"u1 A\nu1 B\n"), [r"hyp:2: duplicate key u1 \(first on line 1\)"]),
    "score-hyp-non-utf8": Case(score_case(b"u1 A\nu2 \xff\n"), [r"hyp:2: not UTF-8"]),
    # ---------------------------------------------------------------- sync configs
    "cfg-unknown-algorithm": Case(sync_yaml("sync:\n  algorithm: gosip_bmuf\n"),
                                  [r"sync.yaml: sync.algorithm='gosip_bmuf' is unknown", r"gossip_bmuf"]),
    "cfg-unknown-key": Case(sync_yaml("sync:\n  perod: 8\n"), [r"sync.yaml", r"perod"]),
    "cfg-wrong-type": Case(sync_yaml("sync:\n  period: often\n"), [r"sync.yaml", r"period", r"often"]),
    "cfg-q-gt-2p": Case(sync_yaml("sync:\n  algorithm: gossip_ma\n  p: 1\n  q: 3\n"),
                        [r"sync.yaml: sync.q=3 > 2 \* sync.p = 2", r"lower sync.q"]),
    "cfg-period-0": Case(sync_yaml("sync:\n  period: 0\n"), [r"sync.yaml: sync.period=0 must be >= 1"]),
    "cfg-component-period-0": Case(sync_yaml("sync:\n  components:\n    - {name: all, period: 0}\n"),
                                   [r"sync.components\[0\].period=0 must be >= 1"]),
    "cfg-component-unknown-key": Case(sync_yaml("sync:\n  components:\n    - {name: all, peroid: 4}\n"),
                                      [r"sync.yaml: sync.components\[0\].peroid is not a component rule key"]),
    "cfg-yaml-syntax": Case(sync_yaml("sync:\n  period: [8\n"), [r"sync.yaml"]),
    "cfg-non-utf8": Case(sync_yaml(b"sync:\n  algorithm: caf\xe9\n"), [r"sync.yaml", r"UTF-8|utf-8"]),
    "cfg-missing-file": Case(lambda tmp: (load_sync_config, tmp / "nope.yaml", []), [r"nope.yaml"]),
    "cfg-empty-file": Case(sync_yaml(""), [r"sync.yaml: empty \(no keys\)", r"sync:"]),
    "cfg-comments-only": Case(sync_yaml("# period: 8\n"), [r"sync.yaml: empty \(no keys\)"]),
    "cfg-top-level-list": Case(sync_yaml("- algorithm: ma\n- period: 8\n"),
                               [r"sync.yaml: the top level is a list, not a mapping", r"sync:"]),
    "cfg-sync-section-not-a-mapping": Case(sync_yaml("sync:\n"), [r"sync.yaml: `sync:` must be a mapping"]),
    # train.config.load_structured belongs to H4: its omegaconf messages span several lines (key on line 2)
    "cfg-train-unknown-key": Case(structured_yaml("train:\n  lrr: 0.1\n"), [r"train.yaml", r"lrr"], one_line=False),
    "cfg-train-wrong-type": Case(structured_yaml("train:\n  lr: fast\n"), [r"train.yaml", r"lr", r"fast"],
                                 one_line=False),
    "cfg-component-misses-param": Case(components_case([{"name": "emb", "pattern": r"^embedding\."}]),
                                       [r"parameter 'linear.weight' matches no sync.components pattern",
                                        r"catch-all"]),
    "cfg-component-matches-nothing": Case(components_case([{"name": "emb", "pattern": r"^embeding\."},
                                                           {"name": "rest"}]),
                                          [r"sync.components 'emb': pattern .* matches no trainable parameter"]),
}


@dataclass
class _TrainSchema:   # a stand-in for a recipe's train section (load_structured's schema argument)
    lr: float = 0.1
    epochs: int = 1


@dataclass
class _Schema:
    train: _TrainSchema = field(default_factory=_TrainSchema)


def run_case(case: Case, tmp: Path, capsys) -> tuple[int, str, dict]:
    main, arg, protected = case.setup(tmp)
    capsys.readouterr()
    before = snapshot(*protected)
    if main is load_sync_config:
        with pytest.raises(ConfigError) as e:
            load_sync_config(arg)
        return 1, str(e.value), before
    if main == "structured":
        from gossip_accel.train.config import load_structured
        with pytest.raises(ConfigError) as e:
            load_structured(_Schema, [str(arg)], [])
        return 1, str(e.value), before
    if main == "components":
        import torch
        from gossip_accel.sync.components import split_components
        from gossip_accel.sync.config import ComponentRule

        model = torch.nn.Sequential()
        model.add_module("embedding", torch.nn.Embedding(4, 2))
        model.add_module("linear", torch.nn.Linear(2, 2))
        with pytest.raises(ConfigError) as e:
            split_components(model.named_parameters(), [ComponentRule(**r) for r in arg], 4)
        return 1, str(e.value), before
    rc, msg = run_cli(main, arg, capsys)
    return rc, msg, before


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input(case_id, tmp_path, capsys):
    case = CASES[case_id]
    rc, msg, before = run_case(case, tmp_path, capsys)
    assert rc == case.code, f"exit code {rc}, message:\n{msg}"
    for pattern in case.says:
        assert re.search(pattern, msg), f"{pattern!r} not in:\n{msg}"
    assert "Traceback" not in msg
    if case.one_line:
        assert len(msg.splitlines()) == 1, msg
    assert snapshot(*before) == before, "a failed run changed existing outputs"
    assert not list(tmp_path.rglob("RAN")), "a command from a data file was executed"
    assert not [p for p in tmp_path.rglob("*") if re.search(r"\.tmp\d+$", p.name)], "temporary files left"


# ------------------------------------------------------------------------------------------ what must work

def test_wav_scp_paths_with_spaces_and_quotes_work(tmp_path, capsys):
    """A wav.scp value is the rest of the line: spaces and quotes in the path are part of it."""
    d = make_data_dir(tmp_path / "my data", audio_name="it's \"my\" audio dir")
    assert all(" " in v and "'" in v and '"' in v for v in kd.read_wav_scp(d / "wav.scp").values())
    assert validate_data_dir.main([str(d)]) == 0
    out = tmp_path / "my data" / "fb 'x'"
    compute_fbank.main(["--data", str(d), "--out", str(out), "--no-progress", "--nj", "2"])
    compute_cmvn.main(["--data", str(d)])
    feats = kd.read_feats_scp(d / "feats.scp")
    assert sorted(feats) == ["spk1-u0", "spk1-u1", "spk1-u2"]
    import kaldiio
    assert kaldiio.load_mat(feats["spk1-u2"]).shape[1] == 80
    # the shell entry points, on the same dir (its path has spaces and quotes)
    r = subprocess.run(["bash", str(ROOT / "utils" / "fix_data_dir.sh"), str(d)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "kept 3 of 3 utterances" in r.stderr, r.stderr
    r = subprocess.run(["bash", str(ROOT / "utils" / "validate_data_dir.sh"), str(d)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "OK (3 utterances, 1 speakers)" in r.stdout


def test_wav_scp_pipe_runs_only_with_opt_in(tmp_path, capsys):
    """Kaldi runs ``cmd |`` values; gossip_accel only with --allow-pipes (then via bash)."""
    d = make_data_dir(tmp_path)
    wav = kd.read_wav_scp(d / "wav.scp")
    marker = tmp_path / "ran"
    kd.write_wav_scp(d / "wav.scp", {**wav, "spk1-u1": f"touch '{marker}'; cat '{wav['spk1-u1']}' |"})
    rc, msg = run_cli(compute_fbank.main, ["--data", str(d), "--out", str(tmp_path / "f"), "--no-progress"], capsys)
    assert rc == 1 and "wav.scp:2" in msg and "--allow-pipes" in msg and not marker.exists()
    assert not (d / "feats.scp").exists()
    compute_fbank.main(["--data", str(d), "--out", str(tmp_path / "f"), "--no-progress", "--allow-pipes"])
    assert marker.exists() and len(kd.read_feats_scp(d / "feats.scp")) == 3


def test_failed_rerun_keeps_features_then_good_rerun_replaces_them(tmp_path, capsys):
    d, fb = with_features(tmp_path)
    first = snapshot(d / "feats.scp", fb)
    bad_audio("garbage")(d)
    for nj in ("1", "2"):
        rc, _ = run_cli(compute_fbank.main, ["--data", str(d), "--out", str(fb), "--nj", nj, "--no-progress"], capsys)
        assert rc == 1 and snapshot(d / "feats.scp", fb) == first
    rc, msg = run_cli(compute_fbank.main, ["--data", str(d), "--out", str(fb), "--nj", "2", "--no-progress",
                                           "--on-error", "skip"], capsys)
    assert rc == 0 and "skipped spk1-u1" in msg
    assert sorted(kd.read_feats_scp(d / "feats.scp")) == ["spk1-u0", "spk1-u2"]
    assert kd.read_table(fb / "skipped.txt").keys() == {"spk1-u1"}
    assert not [p for p in fb.iterdir() if ".tmp" in p.name]


def test_validate_sh_names_the_line_and_exits_1(tmp_path):
    d = make_data_dir(tmp_path / "a dir")
    replace_line(d / "text", 2, b"spk1-u1")
    r = subprocess.run(["bash", str(ROOT / "utils" / "validate_data_dir.sh"), str(d)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and f"{d}/text:2: empty transcript for spk1-u1" in r.stderr
    assert "Traceback" not in r.stderr


def test_q_gt_2p_with_defaults_needs_the_world(tmp_path):
    """q alone is checked once n is known: p defaults to round(log2 n) - 1."""
    from gossip_accel.sync.config import validate_for_world

    cfg = load_sync_config({"algorithm": "gossip_bmuf", "q": 3})
    validate_for_world(cfg, 16)                  # p = 3: fine
    with pytest.raises(ConfigError, match=r"sync.q=3 > 2 \* sync.p = 2 with n=4"):
        validate_for_world(cfg, 4)               # p = 1


# ------------------------------------------------------------------------------------------ safety audit

PY_DIRS = ("gossip_accel", "bench", "tests", "recipes", "utils")


def _py_files() -> list[Path]:
    out = []
    for d in PY_DIRS:
        out += [p for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts and "__pycache__" not in p.parts]
    return sorted(out)


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def unsafe_calls(path: Path) -> list[str]:
    """``line: what`` for every call that breaks a safety rule (docs/RELIABILITY.md, Safety)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] in ("pickle", "cPickle", "dill", "shelve", "marshal") for n in names):
                bad.append(f"{node.lineno}: imports a pickle module")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        wo = _kw(node, "weights_only")
        if name.endswith("torch.load"):
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                bad.append(f"{node.lineno}: torch.load without weights_only=True")
        elif name in ("eval", "exec", "compile", "__import__"):
            bad.append(f"{node.lineno}: {name}()")
        elif name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
            bad.append(f"{node.lineno}: {name} (use yaml.safe_load / omegaconf)")
        elif name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
            bad.append(f"{node.lineno}: {name} (runs a shell)")
        elif name.endswith(("np.load", "numpy.load")):
            ap = _kw(node, "allow_pickle")
            if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                bad.append(f"{node.lineno}: np.load with allow_pickle")
        sh = _kw(node, "shell")
        if sh is not None and not (isinstance(sh, ast.Constant) and sh.value is False):
            bad.append(f"{node.lineno}: {name}(..., shell=...) (pass an argument list)")
    return bad


@pytest.mark.parametrize("top", PY_DIRS)
def test_python_safety_rules(top):
    findings = []
    for p in _py_files():
        rel = p.relative_to(ROOT).as_posix()
        if rel.split("/")[0] != top:
            continue
        findings += [f"{rel}:{f}" for f in unsafe_calls(p)]
    assert not findings, "\n".join(findings)


def test_audit_catches_what_it_should(tmp_path):
    """The audit itself finds each kind of unsafe call (so a green run means something)."""
    p = tmp_path / "x.py"
    p.write_text("import pickle\nimport torch, yaml, subprocess, os\ntorch.load('a')\ntorch.load('a', weights_only=False)\n"
                 "eval('1')\nexec('x=1')\nyaml.load(s)\nsubprocess.run('ls', shell=True)\nos.system('ls')\n"
                 "torch.load('a', weights_only=True)\nmodel.eval()\nyaml.safe_load(s)\n")
    got = [f.split(":")[0] for f in unsafe_calls(p)]
    assert got == ["1", "3", "4", "5", "6", "7", "8", "9"], unsafe_calls(p)


#: every shell script of the project: its path expansions must be quoted
SHELL_GLOBS = ("utils/*.sh", "recipes/*/*/local/*.sh", "path.sh", "run.sh", "recipes/*/*/run.sh",
               "recipes/*/*/path.sh", "bench/**/*.sh", ".ci/*")
#: path-like variable names (and positional parameters): their unquoted expansion splits a path
#: with spaces into several words and globs it
_PATHY = re.compile(r"^(?:\w*(?:dir|root|path|out|src|dst|file|data|local|venv|tpl|here|exp|scp|ark|lang|model|conf)"
                    r"\w*|[0-9])$", re.I)


def bare_expansions(code: str) -> list[str]:
    """Names of the parameter expansions of one line of bash that are not inside double quotes
    (nor single quotes, nor arithmetic), in order: ``$x``, ``${x}``, ``${x:-...}``, ``$1``.
    Command substitutions are followed: in ``"$(basename $dir)"`` the ``$dir`` is bare.
    Assignments (``x=$y``, no splitting there) do not count."""
    out, stack, i = [], ["top"], 0
    while i < len(code):
        c, top = code[i], stack[-1]
        if c == "\\":
            i += 2
            continue
        if top == "sq":
            if c == "'":
                stack.pop()
        elif c == "'" and top != "dq":
            stack.append("sq")
        elif c == '"':
            if top == "dq":
                stack.pop()
            else:
                stack.append("dq")
        elif code.startswith("$((", i):
            stack.append("arith")
            i += 3
            continue
        elif code.startswith("$(", i):
            stack.append("cmd")
            i += 2
            continue
        elif c == ")" and top in ("cmd", "arith"):
            stack.pop()
            if top == "arith" and code.startswith(")", i + 1):
                i += 1
        elif c == "$" and top in ("top", "cmd"):
            m = re.match(r"\$(?:\{([#!]?)(\w+)[^}]*\}|(\w+))", code[i:])
            if m:
                assignment = re.search(r"(?:^|[\s;(])[A-Za-z_]\w*=$", code[:i]) is not None
                if not assignment and not m.group(1):
                    out.append(m.group(2) or m.group(3))
                i += m.end()
                continue
        i += 1
    return out


def unquoted_path_expansions(path: Path) -> list[str]:
    """``line: text`` for lines that expand a path-like variable (dir, out, root, data... or
    ``$1``) outside double quotes. ``case $x in`` and ``for x in $list`` (word splitting
    wanted, or none happens) are not flagged; comments and here-documents' text are code-free."""
    out, heredoc = [], None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        code = "" if line.lstrip().startswith("#") else re.split(r"\s#", line, maxsplit=1)[0]
        m = re.search(r"<<-?\s*['\"]?(\w+)", code)
        if m:
            heredoc = m.group(1)
        if re.match(r"\s*(case|for)\b", code):
            continue
        if any(_PATHY.match(name) for name in bare_expansions(code)):
            out.append(f"{n}: {line.strip()}")
    return out


def _shell_files() -> list[str]:
    files = {p for g in SHELL_GLOBS for p in ROOT.glob(g) if p.is_file() and not p.is_symlink()}
    return sorted(p.relative_to(ROOT).as_posix() for p in files
                  if p.suffix == ".sh" or p.read_bytes()[:2] == b"#!" and b"sh" in p.read_bytes().split(b"\n")[0])


@pytest.mark.parametrize("rel", _shell_files())
def test_shell_scripts_quote_paths(rel):
    assert unquoted_path_expansions(ROOT / rel) == []


def test_shell_audit_catches_what_it_should(tmp_path):
    p = tmp_path / "x.sh"
    p.write_text('cp $dir/a "$out"\nx=$dir\necho "$(basename $file)"\n[ -f "$root/x" ] && rm -rf ${data_dir}/y\n'
                 'case $1 in a) ;; esac\nfor f in $files; do :; done\necho "${1:-$out}" $((n + 1))\n'
                 'cat <<EOF\n$dir\nEOF\npython x.py --exp $1 # $dir\necho \'$dir\'\n')
    assert [f.split(":")[0] for f in unquoted_path_expansions(p)] == ["1", "3", "4", "11"]
