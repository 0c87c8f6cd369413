from kvcontract.tools.cli import main

main()
