from inferlab.cli.main import run

run()
