"""``SPARKCTL_SSH_LOG=/path``: paramiko's debug log (key exchange, channels, disconnect reasons).

Lines carry the process id, so several sparkctl runs may append to the same file.
"""

from __future__ import annotations

import logging


def log_ssh_to(path: str) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s.%(msecs)03d pid=%(process)d %(threadName)s %(name)s %(levelname)s: %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("paramiko")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
