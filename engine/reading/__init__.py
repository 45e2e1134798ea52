"""Reading an upload into sampled frames (and its soundtrack) in isolated reader processes. No torch: the
readers load this room under a bare `engine` package, so this __init__.py stays empty."""
