"""Bookkeeping over requests, torch-free at run time: a request's state (request.py), its stage
(stage.py), and what each worker iteration runs (scheduler.py)."""
