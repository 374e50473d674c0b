from spdrank.cli import run

run()
