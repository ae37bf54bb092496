"""Counts of the structural items docs/architecture.md keeps to one each (run from the repo root).

    python scripts/structure_counts.py [--list] [--root PATH/TO/sparkctl]

Each count is a plain text or AST search over sparkctl/ (the stand-in engines and the sandbox
harness excluded: they are not the product's code paths), so a change in a figure can be traced
to lines with --list.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "sparkctl"
SKIP = ("sandbox/", "standin/")
TRANSPORT = "remote/"  # the transport layer: the only place allowed to speak SSH
PROGRAMS = ("docker", "sh", "bash", "python3", "cat", "rm", "mktemp", "ssh", "nvidia-smi", "ip", "ibv_devinfo",
            "df", "stat", "test", "mkdir", "kill", "pkill", "ps", "ls", "du", "find", "tar", "curl", "systemctl")


def files(everything: bool = False):
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if everything or not rel.startswith(SKIP):
            yield rel, path.read_text(encoding="utf-8")


def grep(pattern: str, *, outside: str | None = None, inside: str | tuple[str, ...] | None = None):
    rx = re.compile(pattern)
    for rel, text in files():
        if outside and rel.startswith(outside):
            continue
        if inside and not rel.startswith(inside):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if rx.search(line) and not line.lstrip().startswith("#"):
                yield f"{rel}:{number}: {line.strip()[:110]}"


def long_functions(limit: int = 60):
    for rel, text in files(everything=True):  # the 60-line rule holds for the whole package
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    yield f"{rel}:{node.lineno}: {node.name} ({length} lines)"


def inner_imports():
    for rel, text in files():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        yield f"{rel}:{inner.lineno}: in {node.name}"


# Modules that run on a host inside a shipped agent (the relay, model sync's agent, pack-engram's host
# program): only they are shipped, not commands/, so the commands they start themselves stay there.
SHIPPED = ("images/relay.py", "images/pipe.py", "images/fanout.py", "images/archive.py", "model/agent.py",
           "engram/hostside.py")
# A list that starts like an argv but is none run here: an argv compared (a parser reading one), a
# typing Literal, a command shown to a person as a fix (shlex.join into a hint), a list of check names.
NOT_RUN = re.compile(r'(==|!=)\s*\[|Literal\[|shlex\.join\(\[|^\s*[A-Z_]+_ORDER\s*=')


def argv_outside_commands():
    """Remote commands (argv lists a verb runs) built outside commands/ and the transport."""
    rx = re.compile(r'\[\s*"(' + "|".join(map(re.escape, PROGRAMS)) + r')"\s*,')
    for rel, text in files():
        if rel.startswith(("commands/", TRANSPORT)) or rel in SHIPPED:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if rx.search(line) and not NOT_RUN.search(line):
                yield f"{rel}:{number}: {line.strip()[:110]}"


def say_parameters():
    """Functions that take a line callable named ``say`` (any annotation, or none)."""
    for rel, text in files():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                if any(a.arg == "say" for a in params):
                    yield f"{rel}:{node.lineno}: {node.name}"


def reports_without_runner():
    """Modules that run a verb on many hosts (``fan_out``) and build its report themselves, never
    handing a step to the one runner (``StepRun``/``run_steps``): each is a runner of its own. up's
    step modules (``ops/*_up.py``: a launcher's or the replicas' looks and acts) are run by up's StepRun."""
    for rel, text in files():
        if rel.startswith(TRANSPORT) or rel == "ops/steps.py" or (rel.startswith("ops/") and rel.endswith("_up.py")):
            continue
        calls = {getattr(n.func, "id", getattr(n.func, "attr", "")) for n in ast.walk(ast.parse(text))
                 if isinstance(n, ast.Call)}
        reports = sorted(c for c in calls if c.endswith("Report"))
        if "fan_out" in calls and reports and not calls & {"StepRun", "run_steps", "HostSteps"}:
            yield f"{rel}: {', '.join(reports)}"


def layering():
    rules = [("cli/", "from sparkctl.remote"), ("config/", "from sparkctl.remote"),
             ("images/plan.py", "from sparkctl.standin")]
    for rel, text in files():
        if rel == "cli/context.py":  # the CLI's one door to the transport (connections, -v echo, ssh log)
            continue
        for where, what in rules:
            if rel.startswith(where):
                for number, line in enumerate(text.splitlines(), 1):
                    if what in line:
                        yield f"{rel}:{number}: {line.strip()[:110]}"


COUNTS = {
    # Something that runs a command on a host without going through the transport module.
    "ssh argv built outside remote/": lambda: grep(r'\[\s*"ssh",\s*(\*|"-)|\*BULK_SSH_OPTIONS|peer_ssh_options\(|ssh -o ', outside=TRANSPORT),
    "paramiko Connection( opened outside remote/": lambda: grep(r'\bConnection\(', outside=TRANSPORT),
    "subprocess.Popen outside remote/ (pipe.py, agent.py: inside shipped agents)": lambda: grep(r'subprocess\.Popen\(', outside=TRANSPORT),
    "ConnectionPool( creation sites": lambda: grep(r'ConnectionPool\('),
    "agents shipped by hand (cat > / python3 -c)": lambda: grep(r'cat > "\$1"|"python3", "-c"', outside=TRANSPORT),
    "fact runners (code that runs a Fact's argv)": lambda: grep(r'^\s*(argv = fact\.argv|result = conn\.run\(fact\.argv)'),
    "host-selection copies (unknown host ... inventory has)": lambda: grep(r'unknown host \{'),
    "argv lists outside commands/ and remote/ (remote commands run; shipped agents' own left out)": argv_outside_commands,
    # An engine's behaviour chosen by its name instead of asked of its plugin (sparkctl/engines/).
    "engine-name branches outside engines/": lambda: grep(r'[=!]= "(sglang|vllm|single-box)"',
                                                          outside="engines/"),
    # How the engine runs (docker / native) chosen by the profile's launcher name instead of asked of
    # its plugin (sparkctl/launchers/); config/ validates the field itself, below the plugins.
    "launcher branches outside launchers/": lambda: grep(r'(?<!distributed\.)\blauncher\s*[=!]=\s*"(docker|native)"',
                                                         outside="launchers/"),
    "*Report classes": lambda: grep(r'^class \w*Report\b'),
    # One step runner (ops/steps.StepRun): a step's status written anywhere else is a second runner.
    "step statuses set by hand (outside ops/steps.py)": lambda: grep(r'\b\w+\.status, \w+\.reason\s*=', outside="ops/steps.py"),
    "report conversions in up's steps (a report's ok read by hand)": lambda: grep(
        r'if not (report|result)\.ok\b', inside=("ops/up", "ops/docker_up", "ops/native_up", "ops/replica_up")),
    "verbs reporting per host outside the step runner (fan_out + *Report, no StepRun)": reports_without_runner,
    "_Progress classes": lambda: grep(r'^class _?\w*Progress\b'),
    # Progress told through a callback instead of the reporter's events (sparkctl/reporter.py).
    "say callbacks (a say parameter, annotated or not)": say_parameters,
    "docker image inspect built": lambda: grep(r'"image", "inspect"'),
    "functions over 60 lines (all of sparkctl/)": long_functions,
    "imports inside functions": inner_imports,
    "layering slips (cli/ but context.py, config/ -> remote; images/plan -> standin)": layering,
}


def main() -> None:
    global ROOT
    show = "--list" in sys.argv
    if "--root" in sys.argv:
        ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
    for name, count in COUNTS.items():
        rows = list(count())
        print(f"{len(rows):5d}  {name}")
        if show:
            for row in rows:
                print(f"         {row}")


if __name__ == "__main__":
    main()
