from streamserve.cli.main import run

run()
