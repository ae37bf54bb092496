"""Stand-in of the ``sglang`` package: only ``python3 -m sglang.launch_server`` (the sparkctl stand-in engine)."""
