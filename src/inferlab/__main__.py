from inferlab._cli import main

main()
