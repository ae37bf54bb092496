"""``sparkctl doctor``: every host checked in parallel before anything runs.

sparkctl/commands/probes.py  what to run on a host and how to read its output (typed facts), no I/O
verdicts.py facts + what the profile needs -> pass/warn/fail with a one-line detail and a fix hint
run.py      gathers the facts over SSH on all hosts at once and applies the verdicts
"""
