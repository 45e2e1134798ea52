"""Models built without the Hub: the tiny ones (tiny.py, tiny_nemotron.py), real architectures with
random weights from stored specs (random_weights.py, specs/), and the byte-level tokenizer they share
(tokenizer.py)."""
