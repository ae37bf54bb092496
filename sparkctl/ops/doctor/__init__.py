"""``sparkctl doctor``: every host checked in parallel before anything runs.

sparkctl/commands/probes.py  what to run on a host and how to read its output (typed facts), no I/O
expectations.py what the checks compare against (the inventory's folders, what a profile needs)
gather.py   every probe on every host at once, through the one fact runner (answers, or why not)
verdicts.py facts + what the profile needs -> pass/warn/fail with a one-line detail and a fix hint
judge.py    one host's findings (and all hosts', for the checks that compare them) -> its checks
run.py      the run: gather, then each host's checks as steps of the one protocol, told to the reporter
fixes.py    which `sparkctl setup` step fixes a failed check
"""
