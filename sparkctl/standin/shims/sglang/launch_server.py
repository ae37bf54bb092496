"""``python3 -m sglang.launch_server [options]``: the sparkctl stand-in engine with SGLang's command line."""

import sys

try:  # the stop signals first: as PID 1 a SIGTERM without a handler is dropped (stopsignal.py)
    from sparkctl_standin import stopsignal
except ImportError:  # a checkout: the package under its own name
    from sparkctl.standin import stopsignal
stopsignal.exit_on_stop()

try:
    from sparkctl_standin.cli import sglang_main
except ImportError:
    from sparkctl.standin.cli import sglang_main

if __name__ == "__main__":
    sys.exit(sglang_main(sys.argv[1:]))
