from ipybox._cli import main

main()
