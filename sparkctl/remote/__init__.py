"""The transport: the only part of sparkctl that reaches a host (docs/architecture.md).

``SSHTarget`` says where, ``Connection`` (paramiko) runs argv lists there (plain, or streaming
stdin/stdout with byte counts), ``process.ProcessTransport`` does the same through a local process
(this machine, or the system ssh client for bulk streams), ``openssh`` builds every ssh argv and
chooses routes, ``transport`` ships agents, ``fake`` answers unit tests, ``ConnectionPool`` keeps
one connection per host and ``fan_out`` runs a step on many hosts at once, returning one
``HostResult`` per host. Import the submodules directly
(``from sparkctl.remote.connection import Connection``): this package stays cheap to import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types


class _LoadedOnFirstUse(types.ModuleType):
    """Stands in ``sys.modules`` for a module until one of its names is asked for, then imports it.

    paramiko imports invoke when it is imported, only to run an ssh config's ``Match exec`` lines;
    invoke in turn loads unittest.mock and asyncio: a third of paramiko's import CPU (~0.14 s),
    paid by every command that reaches a host. (The standard library's ``LazyLoader`` does not help
    here: an ``import`` statement reads the module's ``__spec__``, which makes it load at once.)
    Connections open in parallel threads: the lock lets one of them import it, the others then
    find it imported.
    """

    def __init__(self, spec) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec
        self.__dict__["_lock"] = threading.Lock()

    def __getattr__(self, name: str):  # called only for names this placeholder does not have
        with self.__dict__["_lock"]:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
        return getattr(real, name)


def _defer(name: str) -> None:
    if name in sys.modules or "paramiko" in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is not None:  # not installed: paramiko says so itself when a config needs it
        sys.modules[name] = _LoadedOnFirstUse(spec)


_defer("invoke")
