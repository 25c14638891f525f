"""ASR pieces: CTC decoding and WER scoring."""
