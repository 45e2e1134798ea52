"""The decoders a reader process runs (engine/reading/reader_process.py): PyAV for videos, their soundtracks and
live streams, Pillow for pictures. Nothing here loads torch, and nothing here runs in the engine's process
except in tests and benchmarks."""
