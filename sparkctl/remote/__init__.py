"""Remote execution: the only part of sparkctl that speaks SSH (paramiko).

``SSHTarget`` says where, ``Connection`` runs argv lists there (plain, or streaming stdin/stdout
with byte counts), ``ConnectionPool`` keeps one connection per host and ``fan_out`` runs a step on
many hosts at once, returning one ``HostResult`` per host. Import the submodules directly
(``from sparkctl.remote.connection import Connection``): this package stays cheap to import.
"""
