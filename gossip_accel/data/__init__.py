"""Data: LM token streams now; Kaldi data dirs, features and batching by length later."""
