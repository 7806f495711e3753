from inferlab.cli.main import run

if __name__ == "__main__":  # (not when a worker process imports it: see load.workers)
    run()
