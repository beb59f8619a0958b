import sys

from kvemu.router_cmd import main

sys.exit(main())
