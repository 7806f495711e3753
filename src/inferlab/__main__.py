from inferlab._cli import run

run()
