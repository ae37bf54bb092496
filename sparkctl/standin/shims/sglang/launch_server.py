"""``python3 -m sglang.launch_server [options]``: the sparkctl stand-in engine with SGLang's command line."""

import sys

try:
    from sparkctl_standin.cli import sglang_main
except ImportError:  # a checkout: the package under its own name
    from sparkctl.standin.cli import sglang_main

if __name__ == "__main__":
    sys.exit(sglang_main(sys.argv[1:]))
