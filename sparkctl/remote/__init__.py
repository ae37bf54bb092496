"""The transport: the only part of sparkctl that reaches a host (docs/architecture.md).

``SSHTarget`` says where, ``Connection`` (paramiko) runs argv lists there (plain, or streaming
stdin/stdout with byte counts), ``process.ProcessTransport`` does the same through a local process
(this machine, or the system ssh client for bulk streams), ``openssh`` builds every ssh argv and
chooses routes, ``transport`` ships agents, ``fake`` answers unit tests, ``ConnectionPool`` keeps
one connection per host and ``fan_out`` runs a step on many hosts at once, returning one
``HostResult`` per host. Import the submodules directly
(``from sparkctl.remote.connection import Connection``): this package stays cheap to import.
"""
