"""Kaldi data directories: read and write their tables (:mod:`.tables`), validate them
(:mod:`.validate`), fix them (:mod:`.fix`).

A data directory holds one table per file, one ``<key> <value>`` line per entry, sorted by
key in C-locale byte order (= code-point order for UTF-8), keys unique and without
whitespace. The value is **the rest of the line** after the first run of whitespace
(trailing whitespace removed), so a ``wav.scp`` path may contain spaces; a ``wav.scp`` value
ending in ``|`` is a shell command whose stdout is the audio (Kaldi's pipes); validation
accepts it without running it, and ``compute_fbank`` runs it only with ``--allow-pipes``
(:func:`refuse_commands`: nothing runs text from a data file unless the user opts in).

| file | key | value |
|---|---|---|
| ``wav.scp`` | utterance (recording if ``segments`` exists) | path or ``command |`` |
| ``text`` | utterance | transcript (may not be empty) |
| ``utt2spk`` | utterance | speaker |
| ``spk2utt`` | speaker | its utterances, sorted |
| ``spk2gender`` | speaker | ``m`` / ``f`` |
| ``segments`` | utterance | ``<recording> <start-s> <end-s>`` |
| ``reco2file_and_channel`` | recording | ``<file> <channel>`` |
| ``feats.scp`` | utterance | ``file.ark:offset`` (or a path) |
| ``utt2num_frames`` | utterance | integer |
| ``utt2dur`` | utterance | seconds |

``validate_data_dir(path)`` returns the problems (each naming file and line), like Kaldi's
``utils/validate_data_dir.sh``; ``fix_data_dir(path)`` keeps the utterances present in every
utterance table (and with a transcript and audio), rebuilds ``spk2utt``, sorts, and reports
every utterance it drops and why (stderr and ``<dir>/.backup/dropped.txt``; the original files
are copied to ``<dir>/.backup/`` first), like Kaldi's ``utils/fix_data_dir.sh``.
"""
from .fix import FixReport, fix_data_dir
from .tables import (
    UTT_FILES, KNOWN_FILES, DEFAULT_NEED, DataDirError, Entry, decode_utf8,
    read_entries, read_table, write_table, is_command, refuse_commands, read_wav_scp,
    read_text, read_utt2spk, read_spk2gender, read_spk2utt, read_feats_scp, read_segments,
    read_reco2file_and_channel, read_utt2num_frames, read_utt2dur, write_wav_scp, write_text, write_utt2spk,
    write_spk2gender, write_feats_scp, write_spk2utt, write_segments, write_reco2file_and_channel, write_utt2num_frames,
    write_utt2dur, utt2spk_to_spk2utt, spk2utt_to_utt2spk,
)
from .validate import audio_path_exists, positive_value, segment_fields, validate_data_dir

__all__ = [
    "DEFAULT_NEED", "DataDirError", "Entry", "FixReport", "KNOWN_FILES", "UTT_FILES", "audio_path_exists",
    "decode_utf8", "fix_data_dir", "is_command", "positive_value", "read_entries", "read_feats_scp",
    "read_reco2file_and_channel", "read_segments", "read_spk2gender", "read_spk2utt", "read_table",
    "read_text", "read_utt2dur", "read_utt2num_frames", "read_utt2spk", "read_wav_scp", "refuse_commands",
    "segment_fields", "spk2utt_to_utt2spk", "utt2spk_to_spk2utt", "validate_data_dir", "write_feats_scp",
    "write_reco2file_and_channel", "write_segments", "write_spk2gender", "write_spk2utt", "write_table",
    "write_text", "write_utt2dur", "write_utt2num_frames", "write_utt2spk", "write_wav_scp",
]
