from kiwi.cli import run

run()
