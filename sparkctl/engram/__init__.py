"""Engram-on-disk: which rows of the two n-gram hash tables each rank owns, and how they get to its NVMe.

``layout`` is the model's own arithmetic (pure), ``config`` reads it from ``config.json``,
``safetensors_index`` finds the tables' byte ranges, ``shards`` cuts and streams them, and
``checkpoint_maker`` writes a small synthetic checkpoint with the same shape for tests.
"""
