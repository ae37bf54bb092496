from sparkctl.cli.main import run

run()
