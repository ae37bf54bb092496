"""``python -m sparkctl.standin vllm serve MODEL ...``, ``python -m sparkctl.standin sglang --model-path ...``
or ``python -m sparkctl.standin singlebox --engine v41`` (settings from the environment)."""

import sys

from .stopsignal import exit_on_stop

exit_on_stop()  # before anything else is imported: as PID 1 a SIGTERM without a handler is dropped

from .cli import sglang_main, vllm_main  # noqa: E402


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["vllm"]:
        return vllm_main(args[1:])
    if args[:1] == ["sglang"]:
        return sglang_main(args[1:])
    if args[:1] == ["singlebox"]:
        from .singlebox import main as singlebox_main

        return singlebox_main(args[1:])
    sys.stderr.write("usage: python -m sparkctl.standin {vllm serve MODEL [options] | sglang --model-path DIR [options] | singlebox --engine v41}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
