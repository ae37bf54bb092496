"""Local test clusters: network-namespace hosts with their own sshd, dockerd and /mnt/nvme.

``cluster`` runs them (up/status/down and helpers for tests), ``layout`` names and addresses them
(pure), ``standins`` holds the GB10 stand-in commands, ``cli`` is `sparkctl sandbox`.
"""
