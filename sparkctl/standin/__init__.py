"""The stand-in serving engine: speaks vLLM's and SGLang's command lines and OpenAI HTTP API, no GPU.

It runs inside a minimal container (python3 and its standard library only, Python 3.9+), so
everything here is stdlib and uses relative imports: in the image the package is installed as the
top-level ``sparkctl_standin`` next to a ``vllm`` script and an ``sglang.launch_server`` shim
(see ``rootfs.py``); in a checkout it runs as ``python -m sparkctl.standin vllm serve ...``.

What it imitates, because sparkctl's serve/status/bench paths depend on it:

* argv parsed against the real option list of the engine version (``engine_flags/*.json``):
  an unknown option, a missing or forbidden value, or a value outside ``choices`` is an
  argparse error and exit 2, as the real parser does (``flags.py``);
* a multi-node job: rank 0 hosts the rendezvous on ``--master-port`` (SGLang: ``--dist-init-addr``)
  and serves HTTP only once every rank is connected over TCP; a rank leaving ends the job
  (``rendezvous.py``);
* the checkpoint (``/model/config.json``) and, with ``DSV41_ENGRAM_DISK=1``, this rank's Engram
  shards (``model.py``);
* the OpenAI API with streaming, reasoning, usage and length errors, and timing that depends on
  prompt length and concurrency so benchmarks show the shape of the TP4 and TP8 vLLM reports' tables (``server.py``, ``simulate.py``).
"""

__version__ = "0.1.0"
