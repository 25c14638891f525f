"""Models: LSTMP language model with adaptive softmax (acoustic models come with the ASR recipe)."""
