"""CTC decoding (greedy, prefix beam search with LM fusion) and Kaldi-format WER scoring."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from gossip_accel.asr.ctc_decode import beam_search_decode, greedy_decode, prefix_beam_search
from gossip_accel.asr.scoring import align_words, compute_wer, write_scoring_dir
from gossip_accel.bin import score_wer


def posterior(frames: list[list[float]]) -> torch.Tensor:
    """(T, V) log-probs from per-frame probabilities (normalized)."""
    p = torch.tensor(frames, dtype=torch.float64)
    return (p / p.sum(-1, keepdim=True)).log()


def peaky(labels: list[int], v: int = 5, peak: float = 0.9) -> torch.Tensor:
    rest = (1 - peak) / (v - 1)
    return posterior([[peak if j == c else rest for j in range(v)] for c in labels])


def test_greedy_collapses_repeats_and_drops_blanks():
    lp = peaky([1, 1, 0, 1, 2, 2, 0, 0, 3, 3])
    assert greedy_decode(lp) == [[1, 1, 2, 3]]
    batch = torch.stack([lp, peaky([4, 0, 4, 4, 0, 0, 0, 0, 2, 2])])
    assert greedy_decode(batch, torch.tensor([10, 4])) == [[1, 1, 2, 3], [4, 4]]  # padding ignored
    assert greedy_decode(batch, [0, 10]) == [[], [4, 4, 2]]


@pytest.mark.parametrize("seed", range(5))
def test_beam_one_equals_greedy_on_peaky(seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 6, (40,), generator=g).tolist()
    logits = torch.randn(40, 6, generator=g) + 8 * torch.nn.functional.one_hot(torch.tensor(labels), 6)
    lp = logits.log_softmax(-1)
    expected = greedy_decode(lp)[0]
    assert beam_search_decode(lp, beam=1) == [expected]
    assert beam_search_decode(lp, beam=8) == [expected]


def test_prefix_probabilities_are_exact():
    """Without pruning, P_ctc(y) is the sum over all frame paths that collapse to y."""
    lp = torch.randn(4, 3, generator=torch.Generator().manual_seed(1)).log_softmax(-1)
    brute: dict[tuple, float] = {}
    for path in itertools.product(range(3), repeat=4):
        y = tuple(c for c, _ in itertools.groupby(path) if c != 0)
        brute[y] = brute.get(y, 0.0) + math.exp(sum(lp[t, c].item() for t, c in enumerate(path)))
    hyps = prefix_beam_search(lp, beam=100, token_topk=3)
    assert {h.tokens for h in hyps} == set(brute)
    for h in hyps:
        assert math.isclose(math.exp(h.ctc_score), brute[h.tokens], rel_tol=1e-9)
    assert hyps[0].tokens == max(brute, key=brute.get)


def test_lm_fusion_changes_ambiguous_result():
    # frame probs over (blank, 1, 2): token 1 slightly more likely than token 2
    lp = posterior([[0.1, 0.47, 0.43], [0.9, 0.05, 0.05]])
    assert beam_search_decode(lp, beam=4) == [[1]]

    def lm(prefix, token):  # prefers token 2
        return math.log(0.8 if token == 2 else 0.2)

    assert beam_search_decode(lp, beam=4, lm_score=lm, lm_weight=0.5) == [[2]]
    assert beam_search_decode(lp, beam=4, lm_score=lm, lm_weight=0.0) == [[1]]  # weight 0: LM unused
    best = prefix_beam_search(lp, beam=4, lm_score=lm, lm_weight=0.5, insertion_bonus=0.3)[0]
    assert math.isclose(best.score, best.ctc_score + 0.5 * best.lm_score + 0.3 * len(best.tokens))
    assert math.isclose(best.lm_score, math.log(0.8))


def test_insertion_bonus_favours_longer_output():
    lp = posterior([[0.8, 0.2, 0.0001]] * 3)  # P("") = 0.512 > P(1) = 0.456 > P(1 1) = 0.032
    assert beam_search_decode(lp, beam=4) == [[]]
    assert beam_search_decode(lp, beam=4, insertion_bonus=2.0) == [[1]]


def test_wer_kaldi_lines_and_alignment():
    stats, details = compute_wer({"u1": "A B C D"}, {"u1": "A X C D E"})
    assert (stats.ins, stats.dels, stats.subs, stats.errors, stats.ref_words) == (1, 0, 1, 2, 4)
    assert stats.kaldi_lines() == ["%WER 50.00 [ 2 / 4, 1 ins, 0 del, 1 sub ]", "%SER 100.00 [ 1 / 1 ]",
                                   "Scored 1 sentences, 0 not present in hyp."]
    assert details[0].kaldi_lines() == ["u1 ref  A  B  C  D  ***", "u1 hyp  A  X  C  D   E ",
                                        "u1 op   C  S  C  C   I ", "u1 #csid 3 1 1 0"]
    assert align_words(["THE", "CAT"], ["THE"], "x").kaldi_lines()[2:] == ["x op    C    D ", "x #csid 1 0 0 1"]


def test_cer_counts_letters_and_word_boundaries():
    # "THE CAT" -> "THECAT": one deleted space; "THE CAT" -> "THE BAT": one substituted letter
    stats, _ = compute_wer({"a": "THE CAT", "b": "THE CAT"}, {"a": "THECAT", "b": "THE BAT"})
    assert (stats.chars.ins, stats.chars.dels, stats.chars.subs, stats.chars.ref_chars) == (0, 1, 1, 14)
    assert stats.chars.kaldi_line() == "%CER 14.29 [ 2 / 14, 0 ins, 1 del, 1 sub ]"
    assert stats.as_dict()["cer"] == pytest.approx(100 * 2 / 14)


def test_wer_modes():
    refs, hyps = {"a": "X Y", "b": "Z"}, {"a": "X Y"}
    stats, _ = compute_wer(refs, hyps, "all")
    assert stats.kaldi_lines()[0] == "%WER 33.33 [ 1 / 3, 0 ins, 1 del, 0 sub ] [PARTIAL]"
    assert stats.kaldi_lines()[2] == "Scored 2 sentences, 1 not present in hyp."
    stats, _ = compute_wer(refs, hyps, "present")
    assert stats.kaldi_lines()[:2] == ["%WER 0.00 [ 0 / 2, 0 ins, 0 del, 0 sub ] [PARTIAL]", "%SER 0.00 [ 0 / 1 ]"]
    with pytest.raises(KeyError, match="b"):
        compute_wer(refs, hyps, "strict")


def test_score_wer_cli(tmp_path, capsys):
    (tmp_path / "ref").write_text("u2 THE CAT SAT\nu1 A B C D\n")
    (tmp_path / "hyp").write_text("u1 A X C D E\nu2 THE CAT SAT\n")
    score_wer.main(["--ref", str(tmp_path / "ref"), "--hyp", str(tmp_path / "hyp"), "--out-dir", str(tmp_path / "s")])
    wer = (tmp_path / "s" / "wer").read_text()
    assert wer.splitlines()[0] == "%WER 28.57 [ 2 / 7, 1 ins, 0 del, 1 sub ]"
    assert capsys.readouterr().out == wer
    per_utt = (tmp_path / "s" / "per_utt").read_text().splitlines()
    assert len(per_utt) == 8 and per_utt[3] == "u1 #csid 3 1 1 0" and per_utt[7] == "u2 #csid 3 0 0 0"
    assert (tmp_path / "s" / "hyp.txt").read_text() == "u1 A X C D E\nu2 THE CAT SAT\n"
    assert (tmp_path / "s" / "cer").read_text() == "%CER 16.67 [ 3 / 18, 2 ins, 0 del, 1 sub ]\n"
    stats = write_scoring_dir(tmp_path / "s2", {"u": "A"}, {"u": "A"})
    assert stats.wer == 0.0
