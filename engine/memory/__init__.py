"""What a model costs in device memory (dims.py) and how many requests of what size fit (plan.py)."""
