"""The prompt the language model sees: unpruned (unpruned.py: the HF processor's output, positions), the
soundtrack's part of it (audio.py), and pruned by EVS (pruned.py: kept tokens, positions from the unpruned)."""
