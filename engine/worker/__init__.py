"""The worker thread and its forwards: the loop (loop.py), the runner of vision, prefill and decode steps
(runner.py, vision.py, lm.py), token choice (token_choice.py) and the events sent to streams (events.py)."""
