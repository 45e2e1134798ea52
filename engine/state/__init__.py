"""The language model's state per sequence: KV and recurrent layers (lm_state.py), batched for decode
steps (decode_batch.py), and kept for follow-ups (prefix_cache.py)."""
