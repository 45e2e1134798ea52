"""Choosing the device (device.py), the attention and linear-attention kernels (kernels.py), and loading
a model by name (load.py)."""
