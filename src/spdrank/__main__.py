from spdrank.commands.cli import run

run()
