"""What differs per model family (base.py: the questions; qwen.py, nemotron.py: the answers; registry.py:
which family a loaded model is)."""
